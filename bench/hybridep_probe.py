#!/usr/bin/env python3
"""Standalone probe of DeepEP's HybridEPBuffer with N ranks sharing GPU 0 (no moebench imports).

    PYTHONPATH=/tmp/deepep/none python3 bench/hybridep_probe.py --ranks 2 [--permute] [--gdb]

The parent starts one process per rank (gloo group, torch.cuda.set_device(0) in each), waits with a
timeout and prints one `rank R: PASS|FAIL <why>` line per rank; a rank killed by a signal is reported
with the signal and the tail of its output (faulthandler's Python stack, plus torch's native stack
where torch offers it, or a gdb backtrace with --gdb). Each rank prints `STAGE <name>` before each
step, so the last STAGE line shows where a crash happened:
  import -> stream (a torch error message built with std::ostringstream, before any DeepEP C++)
  -> comm_id (hybrid_ep_cpp's own get_comm_id, called alone through ctypes) -> allocator (hybrid_ep_cpp.ExtendedMemoryAllocator + detect_accessible_ranks, as HybridEPBuffer does)
  -> stream2 -> comm_id2 -> buffer (HybridEPBuffer.__init__; get_comm_id runs in its C++ constructor)
  -> dispatch -> combine [-> dispatch_with_permute -> combine_with_unpermute].
Shared-GPU notes: HybridEPBuffer has no NVML/NVLink check (legacy deep_ep.Buffer has one:
check_nvlink_connections, see --legacy-nvml-bypass); detect_accessible_ranks compares hostnames (or
imports fabric handles when the GPU reports fabric support), NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN
overrides its result; USE_MNNVL=0 (the default here) keeps the allocator on cudaMalloc + CUDA IPC.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256, help="hidden_dim (multiple of 16)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    p.add_argument("--max-tokens", type=int, default=512, help="max_num_of_tokens_per_rank")
    p.add_argument("--local-experts", type=int, default=4, help="num_local_experts (x ranks: multiple of 4)")
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--permute", action="store_true", help="also dispatch_with_permute/combine_with_unpermute")
    p.add_argument("--custom-allgather", action="store_true",
                   help="enable_custom_allgather=True (routing-map allgather over CUDA IPC, not gloo)")
    p.add_argument("--mnnvl", action="store_true", help="leave USE_MNNVL unset (fabric handles if supported)")
    p.add_argument("--legacy-nvml-bypass", action="store_true",
                   help="also build a legacy deep_ep.Buffer with check_nvlink_connections patched out")
    p.add_argument("--no-comm-id", action="store_true",
                   help="skip calling hybrid_ep_cpp's get_comm_id alone (found via the ELF symtab, ctypes)")
    p.add_argument("--gdb", action="store_true", help="run each rank under gdb -batch (native backtrace)")
    p.add_argument("--timeout", type=float, default=480, help="seconds for all ranks (JIT builds included)")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # set in the children
    return p.parse_args()


# ----------------------------------------------------------------------------------------- child
def stage(name):
    print(f"STAGE {name}", flush=True)


def stream_check(torch):
    """A torch error message is built with std::ostringstream << int64 in libc10/ATen: if this
    crashes too, the process' libstdc++ stream/locale state is broken, not DeepEP's code."""
    try:
        torch.empty(6).view(7)
    except RuntimeError as e:
        print(f"  stream ok: {str(e).splitlines()[0][:80]}", flush=True)


def hidden_comm_id(so_path):
    """Return a callable running hybrid_ep_cpp's own (hidden-visibility) get_comm_id(process_group),
    found in the .so's ELF symbol table, so the exact code that crashes can run on its own."""
    import ctypes
    import struct
    data = open(so_path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    value = None
    for sec in secs:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = secs[sec[6]]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, st_info, _, _, st_value, _ = struct.unpack_from("<IBBHQQ", data, off)
            end = data.index(b"\0", strtab[4] + st_name)
            if data[strtab[4] + st_name:end].startswith(b"_Z11get_comm_id") and st_info & 0xF == 2:
                value = st_value
    if value is None:
        return None
    base = ctypes.c_void_p.from_address(ctypes.CDLL(so_path)._handle).value  # link_map->l_addr
    fn = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(base + value)  # keeps the GIL

    def call(group):  # Itanium ABI: std::string via sret pointer, pybind11::object by reference
        ret, arg = ctypes.create_string_buffer(64), ctypes.c_void_p(id(group))
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))  # the reference the caller's copy owns
        fn(ctypes.addressof(ret), ctypes.addressof(arg))
        ptr, size = ctypes.c_void_p.from_buffer(ret, 0).value, ctypes.c_size_t.from_buffer(ret, 8).value
        return ctypes.string_at(ptr, size).decode()
    return call


def child(a):
    import faulthandler
    faulthandler.enable(all_threads=True)
    import torch
    try:  # native (C++) stack on SIGSEGV from c10's fatal-signal handler, where this torch has it
        torch._C._set_print_stack_traces_on_fatal_signal(True)
    except Exception:
        pass
    import torch.distributed as dist

    r, n = a.rank, a.ranks
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=r, world_size=n)
    group = dist.new_group(list(range(n)))
    stage("import")
    import deep_ep
    import hybrid_ep_cpp
    print(f"  deep_ep from {os.path.dirname(deep_ep.__file__)}", flush=True)

    stage("stream")
    stream_check(torch)
    comm_id = None if a.no_comm_id else hidden_comm_id(hybrid_ep_cpp.__file__)
    if comm_id:
        stage("comm_id")  # HybridEPBuffer's crash site, alone, before any DeepEP CUDA work
        print(f"  get_comm_id -> {comm_id(group)}", flush=True)

    if a.legacy_nvml_bypass:
        stage("legacy")
        # Buffer.__init__ calls the name imported into deep_ep.buffer, so patch it there
        # (patching deep_ep.utils.check_nvlink_connections has no effect).
        import deep_ep.buffer as legacy
        legacy.check_nvlink_connections = lambda *args, **kwargs: None
        b = deep_ep.Buffer(group, num_nvl_bytes=1 << 24)
        print(f"  legacy Buffer ok (num_sms={b.num_sms})", flush=True)
        del b

    stage("allocator")  # what HybridEPBuffer.__init__ does first, in Python
    detected = hybrid_ep_cpp.ExtendedMemoryAllocator().detect_accessible_ranks(group)
    print(f"  detect_accessible_ranks={detected}", flush=True)
    stage("stream2")
    stream_check(torch)
    if comm_id:
        stage("comm_id2")
        print(f"  get_comm_id -> {comm_id(group)}", flush=True)

    stage("buffer")
    buf = deep_ep.HybridEPBuffer(group, hidden_dim=a.hidden, max_num_of_tokens_per_rank=a.max_tokens,
                                 num_local_experts=a.local_experts,
                                 enable_custom_allgather=a.custom_allgather)
    print(f"  ranks_per_nvlink_domain={buf.num_of_hybrid_ep_ranks_per_nvlink_domain} "
          f"local_rank={buf.local_rank} node_rank={buf.node_rank}", flush=True)

    # Inputs: every token picks topk distinct experts (a routing map, no -1). Values are small
    # multiples of 1/8, exact in bf16, so sums of topk copies are exact too.
    E, T, H, K = a.local_experts * n, a.tokens, a.hidden, a.topk
    g = torch.Generator(device="cpu").manual_seed(1234 + r)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    routing_map = torch.zeros(T, E, dtype=torch.bool)
    routing_map[torch.arange(T).unsqueeze(1), experts] = True
    hidden = (torch.randint(-64, 64, (T, H), generator=g).float() / 8).to(torch.bfloat16)
    routing_map, hidden = routing_map.cuda(), hidden.cuda()

    # Reference: the tokens of all ranks (rank order, then token order) routed to my experts.
    maps = [torch.empty(T, E, dtype=torch.uint8) for _ in range(n)]
    hids = [torch.empty(T, H, dtype=torch.bfloat16) for _ in range(n)]
    dist.all_gather(maps, routing_map.to(torch.uint8).cpu(), group=group)
    dist.all_gather(hids, hidden.cpu(), group=group)
    gmap, ghid = torch.cat(maps).bool(), torch.cat(hids)
    lo, hi = r * a.local_experts, (r + 1) * a.local_experts
    mine = gmap[:, lo:hi].any(1)

    stage("dispatch")
    out, _, _, handle = buf.dispatch(hidden=hidden, routing_map=routing_map)
    torch.cuda.synchronize()
    num = int(handle[3].cpu().item())
    ok_count = num == int(mine.sum())
    ok_rows = ok_count and torch.equal(out[:num].cpu(), ghid[mine])
    print(f"  dispatched {num} tokens (expected {int(mine.sum())}), rows match: {ok_rows}", flush=True)

    stage("combine")
    copies = handle[4][:num].sum(1, dtype=torch.int32)   # local experts per dispatched token
    comb, _ = buf.combine(hidden=(out[:num].float() * copies.unsqueeze(1)).to(torch.bfloat16),
                          handle=handle)
    torch.cuda.synchronize()
    ok_comb = torch.allclose(comb.float() / K, hidden.float(), atol=1e-2, rtol=1e-2)
    print(f"  combine == topk * input: {ok_comb}", flush=True)
    fails = [w for w, ok in (("dispatch count", ok_count), ("dispatch rows", ok_rows),
                             ("combine", ok_comb)) if not ok]

    if a.permute:
        stage("dispatch_with_permute")
        pout, _, _, padded, phandle = buf.dispatch_with_permute(hidden=hidden, routing_map=routing_map,
                                                                pad_multiple=16)
        torch.cuda.synchronize()
        print(f"  permuted rows {pout.shape[0]}, padded_tokens_per_expert "
              f"{padded.tolist() if padded is not None else None}", flush=True)
        stage("combine_with_unpermute")
        pcomb, _ = buf.combine_with_unpermute(hidden=pout.to(torch.bfloat16), handle=phandle, pad_multiple=16)
        torch.cuda.synchronize()
        ok_p = torch.allclose(pcomb.float() / K, hidden.float(), atol=1e-2, rtol=1e-2)
        print(f"  combine_with_unpermute == topk * input: {ok_p}", flush=True)
        if not ok_p:
            fails.append("combine_with_unpermute")

    dist.barrier(group=group)
    del buf
    print("RESULT " + ("PASS" if not fails else "FAIL " + ",".join(fails)), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------- parent
def main():
    a = parse()
    if a.rank is not None:
        try:
            child(a)
        except Exception as e:  # a Python-level failure: report it and exit non-zero
            import traceback
            traceback.print_exc()
            print(f"RESULT FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            sys.exit(1)
        return

    env = dict(os.environ)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
               NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=str(a.ranks), PYTHONFAULTHANDLER="1")
    env.setdefault("HYBRID_EP_CACHE_DIR", f"/tmp/hybridep-probe-{os.getuid()}")  # JIT .so cache
    if not a.mnnvl:
        env["USE_MNNVL"] = "0"
    if not env.get("CUDA_HOME") and shutil.which("nvcc"):  # the JIT runs $CUDA_HOME/bin/nvcc
        env["CUDA_HOME"] = os.path.dirname(os.path.dirname(shutil.which("nvcc")))
    print(f"# ranks={a.ranks} on GPU 0, gloo; CUDA_HOME={env.get('CUDA_HOME')} "
          f"USE_MNNVL={env.get('USE_MNNVL', '(unset)')}", flush=True)

    argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
    gdb = (shutil.which("gdb") or shutil.which("cuda-gdb")) if a.gdb else None  # the H200 image has cuda-gdb only
    if a.gdb and not gdb:
        print("# --gdb: no gdb here, running without it", flush=True)
    logdir = env.setdefault("HYBRID_EP_PROBE_LOGS", f"/tmp/hybridep-probe-logs-{os.getpid()}")
    os.makedirs(logdir, exist_ok=True)
    procs, logs = [], []
    for r in range(a.ranks):
        cmd = argv + ["--rank", str(r)]
        if gdb:
            ex = ["set pagination off", "run", "bt 40", "info symbol $pc", "x/6i $pc",
                  "info registers rip rsp rdi rsi rax rdx", "info sharedlibrary"]
            cmd = [gdb, "-q", "-batch"] + [x for e in ex for x in ("-ex", e)] + ["--args"] + cmd
        logs.append(open(os.path.join(logdir, f"rank{r}.log"), "w+"))
        procs.append(subprocess.Popen(cmd, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))  # own process group: killpg below

    # Wait for all; once one rank has failed, the others (blocked in a collective) get 30 s more.
    deadline = time.time() + a.timeout
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.time() + 30)
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the rank (and its gdb) only: its own group
            p.wait()
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read())
        f.close()
    npass = 0
    for r, (p, out) in enumerate(zip(procs, outs)):
        lines = (out or "").splitlines()
        last_stage = next((l.split()[1] for l in reversed(lines) if l.startswith("STAGE ")), "-")
        result = next((l[7:] for l in reversed(lines) if l.startswith("RESULT ")), None)
        rc = p.returncode
        if gdb and "received signal" in (out or ""):
            why = next(l for l in lines if "received signal" in l).strip()
        elif rc is not None and rc < 0:
            why = f"killed by {signal.Signals(-rc).name}"
        elif result is None:
            why = f"exit {rc}, no result (timeout or crash)"
        else:
            why = result
        passed = result == "PASS" and rc == 0
        npass += passed
        print(f"rank {r}: {'PASS' if passed else 'FAIL'} ({why}; last stage {last_stage})", flush=True)
        if not passed or r == 0:
            print("\n".join(f"  | {l}" for l in lines[-60:]), flush=True)
    print(f"{npass} passed, {a.ranks - npass} failed")
    sys.exit(0 if npass == a.ranks else 1)


if __name__ == "__main__":
    main()
