"""`nvshmem`: a real cross-PE operation on symmetric memory, values verified (nvshmem4py).

Two PEs per GPU pair when there are 2+ GPUs, else two PEs sharing GPU 0 (shared-GPU ranks, gloo
group). Each PE: UID init over torch.distributed, symmetric tensors, a put to the next PE, and an
all-to-all through the peers' mapped symmetric memory (get_peer_tensor), each followed by
barrier_all, then the values are checked. With several PEs on one GPU and no CUDA MPS server NVSHMEM
runs in "limited MPG" mode (init_status 3): barrier_all, put and peer mappings work there, its team
collectives (alltoall, barrier(team), reduce, ...) print "not supported with limited MPG" and call
exit(-1). The check says so, in NVSHMEM's own words, from one contained attempt of the native alltoall.
A rank that hangs (NVSHMEM's waits spin on the CPU) is ended by the launcher's timeout: FAIL.
"""
from __future__ import annotations

import importlib.util

from . import child
from .comm import gpu_count
from .registry import Context, failed, passed, register, waived

ENV = {"NVSHMEM_DISABLE_NVLS": "1", "PYTHONFAULTHANDLER": "1"}    # NVLink multicast stays off
STATUS = {0: "not initialised", 1: "bootstrapped", 2: "initialised", 3: "limited MPG (several PEs per GPU, no MPS)",
          4: "full MPG (several PEs per GPU, MPS)"}
LIMITED = 3
NATIVE_REFUSED = "not supported with limited MPG"


def import_probe() -> dict:
    import nvshmem
    import nvshmem.core as nv
    v = nv.get_version()
    return {"nvshmem4py": getattr(nvshmem, "__version__", None), "libnvshmem": getattr(v, "libnvshmem_version", None)}


def _init(ctx):
    import numpy as np
    import nvshmem.core as nv
    import torch
    import torch.distributed as dist
    from cuda.core import Device
    dev = Device(ctx.device.index)
    dev.set_current()                         # nvshmem's init does not: the context torch uses
    uid = nv.get_unique_id(empty=ctx.rank != 0)
    raw = np.asarray(uid._data).view(np.uint8)
    buf = torch.from_numpy(raw.copy())
    dist.broadcast(buf, src=0)
    raw[:] = buf.numpy()
    nv.init(device=dev, uid=uid, rank=ctx.rank, nranks=ctx.world, initializer_method="uid")
    return nv


def rank_probe(ctx, native: bool = False) -> dict:
    """One PE: put ring and a peer-mapped all-to-all on symmetric memory, checked; `native`: only the
    native team alltoall (to see what NVSHMEM says of it)."""
    import torch
    nv = _init(ctx)
    r, n, s = ctx.rank, ctx.world, torch.cuda.current_stream()
    out = {"pe": r, "init_status": int(nv.init_status())}
    A, B = nv.tensor((n, 8), dtype=torch.int32), nv.tensor((n, 8), dtype=torch.int32)
    A.copy_((torch.arange(n, device="cuda") + 100 * r).int()[:, None].expand(n, 8))
    B.fill_(-1)
    torch.cuda.synchronize()
    nv.barrier_all(s)
    if native:
        nv.alltoall(nv.Teams.TEAM_WORLD, B, A, stream=s)
    else:
        src, dst = nv.tensor((4,), dtype=torch.int32), nv.tensor((4,), dtype=torch.int32)
        src.fill_(r)
        dst.fill_(-1)
        torch.cuda.synchronize()
        nv.barrier_all(s)
        nv.put(dst, src, remote_pe=(r + 1) % n, stream=s)
        nv.quiet(s)
        nv.barrier_all(s)
        for p in range(n):                                   # all-to-all through the peers' mappings
            nv.get_peer_tensor(B, p)[r].copy_(A[p])
        nv.barrier_all(s)
        torch.cuda.synchronize()
        out["put_ok"] = dst.tolist() == [(r - 1) % n] * 4
        for t in (src, dst):
            nv.free_tensor(t)
    torch.cuda.synchronize()
    out["alltoall_ok"] = B[:, 0].tolist() == [100 * j + r for j in range(n)]
    for t in (A, B):
        nv.free_tensor(t)
    nv.finalize()
    return out


def pes_child(world: int, ranks_per_gpu: int, native: bool, timeout_s: float) -> list:
    from ..harness.launch import run_ranks
    return run_ranks(rank_probe, world, "cuda", timeout_s, args=(native,), ranks_per_gpu=ranks_per_gpu)


def _nvshmem_said(stderr: str) -> str:
    line = next((x.strip() for x in stderr.splitlines() if NATIVE_REFUSED in x), "")
    return line or child.error_line(stderr)


@register("nvshmem", "nvshmem4py: symmetric memory, a put and an all-to-all between PEs (sharing a GPU when only "
          "one is visible), values verified")
def check_nvshmem(ctx: Context):
    if importlib.util.find_spec("nvshmem") is None:
        return waived("nvshmem4py not installed (pip install nvshmem4py-cu13 or -cu12); DeepEP uses the NVSHMEM "
                      "library (nvidia-nvshmem-cu13), not its Python binding, so this checks the library through it")
    r = child.run_function("moebench.checks.nvshmem:import_probe", {}, 120, env=ENV)
    if not r.ok:
        return failed(f"import nvshmem.core {r.failure()}", stderr=r.stderr_tail())
    n, t = gpu_count(), ctx.options.timeout
    if n == 0:
        return waived(f"nvshmem4py {r.value['nvshmem4py']} (libnvshmem {r.value['libnvshmem']}) imports; no GPU here",
                      versions=r.value)
    world, rpg = (n, 1) if n >= 2 else (2, 2)
    where = f"{world} PEs" + (" sharing GPU 0" if rpg > 1 else f" on {n} GPUs")
    run = child.run_function("moebench.checks.nvshmem:pes_child",
                             {"world": world, "ranks_per_gpu": rpg, "native": False, "timeout_s": t}, t + 60, env=ENV)
    if not run.ok:
        return failed(f"{where}: {run.failure()}", stderr=run.stderr_tail(), versions=r.value)
    pes = run.value
    status = pes[0]["init_status"]
    bad = [f"PE {p['pe']}: {what}" for p in pes for what, key in (("put", "put_ok"), ("all-to-all", "alltoall_ok"))
           if not p[key]]
    d = {"versions": r.value, "pes": pes, "init_status": status, "mode": STATUS.get(status, str(status))}
    if bad:
        return failed(f"{where}: wrong values after {', '.join(bad)}", **d)
    note = ""
    if status == LIMITED:
        native = child.run_function("moebench.checks.nvshmem:pes_child",
                                    {"world": world, "ranks_per_gpu": rpg, "native": True, "timeout_s": t}, t + 60,
                                    env=ENV)
        d["native_alltoall"] = "ran" if native.ok else f"{native.failure()}: {_nvshmem_said(native.stderr)}"
        note = ("; NVSHMEM's own team collectives are not available here: its native alltoall "
                + ("ran" if native.ok else f"ended with: {_nvshmem_said(native.stderr)}") + " (no CUDA MPS server)")
    return passed(f"libnvshmem {r.value['libnvshmem']} via nvshmem4py {r.value['nvshmem4py']}, {where}, "
                  f"{d['mode']}: put ring and all-to-all on symmetric memory verified{note}", **d)
