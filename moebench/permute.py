"""python -m moebench.permute: local permute / unpermute kernels against baselines.

Per shape (T x H x K x E) and implementation (torch, triton, cuda, megatron = megatron-core's
unfused moe_utils path, te = Transformer Engine) it checks the result against the torch oracle,
then times the call as a user makes it (index math, allocation, Python glue and all) with
timing.Timer: a --warmup-ms budget, the calls queued back to back with CUDA events around each,
the L2 flushed before every call (timing.py's flush), median and p10/p90 of --iters.
``permute`` is called with the row count known, as Megatron's baseline is (its num_out_tokens);
``permute_wait`` without it, so the host also waits for the device's count.
Effective GB/s counts unique bytes: permute reads T*H and writes R*H (R = routed slots, T*K
without masked slots), unpermute the reverse; fp8 adds the scales. The device-to-device copy
bandwidth (read + write) is measured in the same run and every row reports its fraction.
Inputs are a Workload's tokens and routing (workload.py, uniform routing, ep 1). Kernel variants
are impl strings, passed through to moebench.ops: ``cuda@V`` (variant bits, see csrc/moe_permute.h)
and ``triton@BH:WARPS:UBH:UWARPS:TMA`` (ops/triton_impl.Knobs).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

import moebench.ops as ops
from moebench.ops import te_source
from moebench import cli
from moebench.core.workload import Workload, WorkloadError, rank_inputs
from moebench.harness import preflight
from moebench.harness.timing import Timer, host_us, kernel_profile, write_trace
from moebench.records import plots, provenance, tables, writer
from moebench.records.schema import PermuteRecord

DEFAULT_SHAPES = "4096x7168x8x256,16384x7168x8x256,8192x2048x8x128,8192x4096x8x128"
CPU_SHAPES = "64x128x4x8"
IMPLS = ("torch", "triton", "cuda", "megatron", "te")
# permute: the row count passed in (num_out_rows), as Megatron's baseline is called
# (num_out_tokens); permute_wait: the count worked out on the device, the host waits for it.
OPS = ("permute", "permute_wait", "unpermute")


class UsageError(ValueError):
    pass


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    shapes = []
    for item in names_list(text, "--shapes", what="shape"):
        parts = item.lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise UsageError(f"--shapes: {item!r} is not TxHxKxE with positive integers")
        T, H, K, E = map(int, parts)
        if K > E:
            raise UsageError(f"--shapes: {item!r} has top-k {K} > experts {E}")
        if (T, H, K, E) in shapes:
            raise UsageError(f"--shapes names {T}x{H}x{K}x{E} twice")
        shapes.append((T, H, K, E))
    return shapes


def parse_args(argv):
    p = cli.Parser(prog="python -m moebench.permute", description=__doc__.split("\n")[0])
    own = cli.own_empty           # comma lists: an empty one "names no shape" (names_list)
    own(p.add_argument("--shapes", default=None, help=f"TxHxKxE,... (default {DEFAULT_SHAPES}; CPU {CPU_SHAPES})"))
    own(p.add_argument("--ops-impl", dest="impl", default=None,
                   help="comma list of " + ", ".join(IMPLS) + " (cuda@V, triton@BH:WARPS:... for variants; default all, "
                   "those that cannot run here WAIVED; one named that this machine cannot run is refused)"))
    own(p.add_argument("--impl", dest="impl", default=argparse.SUPPRESS, help=argparse.SUPPRESS))  # old name
    own(p.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS)))
    p.add_argument("--iters", type=cli.count(high=cli.MAX_ITERS), default=50)
    p.add_argument("--warmup-ms", type=cli.number(0, high=cli.MAX_WAIT_S * 1e3), help="warm-up budget per timed row (default 200; CPU 0)")
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16", help="permute payload")
    p.add_argument("--out", default=None, help="JSONL file to append to")
    p.add_argument("--plot", default=None, help="PNG: GB/s per impl and shape with the copy line")
    p.add_argument("--no-flush-l2", dest="no_flush_l2", action="store_true", help="skip the L2 flush before timed calls")
    p.add_argument("--no-flush", dest="no_flush_l2", action="store_true", help=argparse.SUPPRESS)  # old name
    p.add_argument("--profile", action="store_true", help="also record per-kernel times (profiler)")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="also write a Chrome trace (host + GPU) of 4 timed iterations per row to DIR")
    p.add_argument("--seed", type=cli.seed, default=0)
    a = p.parse_args(argv)
    a.explicit = a.impl is not None          # named: one this machine cannot run is bad input, not WAIVED
    a.impl_list = names_list(",".join(IMPLS) if a.impl is None else a.impl, "--ops-impl", IMPLS, "implementation",
                             lambda s: s.split("@")[0])
    a.op_list = names_list(a.ops, "--ops", OPS, "op")
    return a


def names_list(text: str, flag: str, names=None, what: str = "name", base=lambda s: s) -> list[str]:
    """A comma list, each item once and (with `names`) known by its `base`; UsageError (one line) otherwise."""
    try:
        items = cli.comma_list(text, flag, what)
    except ValueError as e:
        raise UsageError(f"{e}" + (f" (give a comma list of {', '.join(names)})" if names else "")) from None
    unknown = next((s for s in items if names and base(s) not in names), None)
    if unknown:
        raise UsageError(f"{flag}: unknown {what} {unknown!r}; known: {', '.join(names)}")
    return items


def memory_problem(w: Workload, device: torch.device) -> str:
    """'' when a shape's inputs and results fit this machine (an estimate, made before anything is drawn: the
    fp32 draws, the [T, E] routing map and probs, the permuted rows and their fp32 draw, the outputs); else why."""
    T, H, K, E = w.num_tokens, w.hidden, w.topk, w.num_experts
    need, have = preflight.draw_bytes(w) + 5 * T * E + 4 * T * H + 8 * T * K * H, preflight.available_bytes(device.type)
    if have is None or need <= have:
        return ""
    return (f"needs ~{need / preflight.GiB:.1f} GiB (an estimate of its inputs and results), {have / preflight.GiB:.1f} "
            f"GiB {'on the GPU' if device.type == 'cuda' else 'available'}: lower T, H or E")


def variant_problem(a) -> str:
    """The first variant named in --ops-impl that is malformed, with why, on any machine ('' when none is)."""
    for spec in a.impl_list:
        name, at, variant = spec.partition("@")
        try:
            if at:
                ops.check_variant(name, variant)
        except ValueError as e:
            return f"--ops-impl {e}"
    return ""


def cannot_run(a) -> str:
    """The first of moebench's own kernels named in --ops-impl that this machine cannot run, with why ('' when
    all can; missing optional packages, megatron and te, are WAIVED rows instead)."""
    for spec in a.impl_list if a.explicit else ():
        name = spec.partition("@")[0]
        if name in ops.IMPLS:
            ok, why = ops.impl_status()[name]
            if not ok:
                return f"--ops-impl {spec}: cannot run on this machine ({why}); leave it out, or --ops-impl torch"
    return ""


# ---------------------------------------------------------------- timing
def measure(timer: Timer, fn, a):
    """timing.Stats of fn: a --warmup-ms budget, then --iters calls queued back to back."""
    warmup = a.warmup_ms if a.warmup_ms is not None else (200.0 if timer.cuda else 0.0)
    return timer.run(fn, a.iters, warmup, queued=True)


def bandwidths(timer: Timer, a) -> dict:
    """GB/s of a D2D copy (read + write counted), a write-only fill and a read-only max."""
    n = (1 << 30) if timer.cuda else (64 << 20)
    src = torch.empty(n // 4, dtype=torch.float32, device=timer.device).normal_()
    dst = torch.empty_like(src)
    med = lambda fn: measure(timer, fn, a).median_us  # noqa: E731
    return dict(copy_GBps=2 * n / med(lambda: dst.copy_(src)) / 1e3,
                write_GBps=n / med(lambda: dst.fill_(1.0)) / 1e3,
                read_GBps=n / med(lambda: src.amax()) / 1e3)


# ---------------------------------------------------------------- implementations
# megatron-core warns once per module that falls back without TE / Apex (four per run); this
# tool's megatron row is its unfused moe_utils path, which needs neither, and `te` has its own row.
_NO_TE_WARNING = "Transformer Engine and Apex are not installed"


def _megatron():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_TE_WARNING, category=UserWarning)
        from megatron.core.transformer.moe import moe_utils
    return moe_utils


def make_case(T, H, K, E, dtype, device, seed):
    """A Workload's rank-0 tokens and uniform routing (fp8: quantized, with its scales)."""
    w = Workload(num_tokens=T, hidden=H, num_experts=E, topk=K, ep=1, dtype=dtype, seed=seed)
    x, idx, wt, q, scales = rank_inputs(w, 0, device)
    x = q if q is not None else x
    routing_map = torch.zeros(T, E, dtype=torch.bool, device=device).scatter_(1, idx, True)
    probs = torch.zeros(T, E, device=device).scatter_(1, idx, wt)
    return dict(x=x, scales=scales, idx=idx, w=wt, routing_map=routing_map, probs=probs)


def op_fns(impl, case, ref, E):
    """({op: fn} for the ops this impl has, check); check() -> error string or ''.
    impl: a name, or for moebench's kernels name@variant (passed to moebench.ops as it is)."""
    name = impl.partition("@")[0]
    x, s, idx, w = case["x"], case["scales"], case["idx"], case["w"]
    y = ref["y"]
    n_out = int(ref["perm"].x_RH.shape[0])
    if name in ("torch", "triton", "cuda"):
        perm = lambda n=None: ops.permute(x, idx, E, scales_TS=s, impl=impl, num_out_rows=n)  # noqa: E731
        unperm = lambda: ops.unpermute(y, ref["perm"].row_map_TK, w, impl=impl)  # noqa: E731

        def check():
            for p in (perm(), perm(n_out)):
                if not (torch.equal(p.row_map_TK, ref["perm"].row_map_TK)
                        and torch.equal(p.x_RH.view(torch.uint8), ref["perm"].x_RH.view(torch.uint8))):
                    return "permute differs from the torch reference"
            return _close(unperm(), ref["unperm"])
        return {"permute": lambda: perm(n_out), "permute_wait": perm, "unpermute": unperm}, check
    if name == "megatron":
        mu = _megatron()
        rm, probs = case["routing_map"], case["probs"]
        sorted_idx = mu.permute(x, rm, num_out_tokens=n_out)[2]  # >= 0.17 requires num_out_tokens
        perm = lambda: mu.permute(x, rm, num_out_tokens=n_out)  # noqa: E731
        unperm = lambda: mu.unpermute(y, sorted_idx, (x.shape[0], y.shape[1]), probs=probs,  # noqa: E731
                                      routing_map=rm)

        def check():
            if not torch.equal(perm()[0].view(torch.uint8), ref["perm"].x_RH.view(torch.uint8)):
                return "megatron permute order differs from the torch reference"
            return _close(unperm(), ref["unperm"])
        return {"permute": perm, "unpermute": unperm}, check
    if name == "te":   # TE's mask-map kernels as moe_permute / moe_unpermute run them (ops/te_source.py)
        tp = te_source.load()[0]
        rm, probs = case["routing_map"].int(), case["probs"].float()    # cast once, outside TE's timed calls
        T, H = x.shape
        sh = s.shape[1] if s is not None else 0
        perm = lambda: tp.permute_with_mask_map(x, tp.make_row_id_map(rm, T, E), None, s, None, T, E,  # noqa: E731
                                                n_out, H, sh)
        row_id_map = tp.make_row_id_map(rm, T, E)
        unperm = lambda: tp.unpermute_with_mask_map(y, row_id_map, probs, None, None, T, E, y.shape[1])[0]  # noqa: E731

        def check():
            if not torch.equal(perm()[0].view(torch.uint8), ref["perm"].x_RH.view(torch.uint8)):
                return "TE permute rows differ from the torch reference"
            return _close(unperm(), ref["unperm"])
        return {"permute": perm, "unpermute": unperm}, check
    raise UsageError(f"unknown impl {name}")


def _close(got, want) -> str:
    try:
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)
        return ""
    except AssertionError as e:
        return "unpermute: " + str(e).splitlines()[0]


def available(name) -> tuple[bool, str]:
    if name in ops.IMPLS:
        return ops.impl_status()[name]
    try:
        if name == "te" and not torch.cuda.is_available():
            return False, "Transformer Engine's permute kernels allocate on CUDA: no GPU here"
        _megatron() if name == "megatron" else te_source.load()
        return True, ""
    except Exception as e:  # noqa: BLE001 - missing or broken optional package -> WAIVED
        return False, f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------- main loop
def unique_bytes(op, T, H, R, case):
    fwd = op.startswith("permute")
    xb = case["x"].element_size() if fwd else 2
    s = case["scales"]
    sb = (s.shape[1] * s.element_size()) if (s is not None and fwd) else 0
    return (T + R) * (H * xb + sb)


def progress(msg: str) -> None:
    """One line on stderr as each (shape, impl) starts: a Triton-interpreter run takes minutes."""
    print(f"# {msg}", file=sys.stderr, flush=True)


def run_shape(shape, a, timer, copy_GBps, device, prov, cmd, where=""):
    T, H, K, E = shape
    case = make_case(T, H, K, E, a.dtype, device, a.seed)
    ref_perm = ops.permute(case["x"], case["idx"], E, scales_TS=case["scales"], impl="torch")
    R = ref_perm.x_RH.shape[0]
    y = torch.randn(R, H, device=device).bfloat16()
    ref = {"perm": ref_perm, "y": y, "unperm": ops.unpermute(y, ref_perm.row_map_TK, case["w"], impl="torch")}
    recs = []
    for i, spec in enumerate(a.impl_list):
        name = spec.partition("@")[0]
        ok, why = available(name)
        progress(f"{where}{T}x{H}x{K}x{E} {spec} ({i + 1}/{len(a.impl_list)} impls)"
                 + ("" if ok else ": WAIVED"))
        base = dict(command=cmd, functional=not timer.cuda,
                    shape=dict(T=T, H=H, K=K, E=E, R=R, dtype=a.dtype), impl=spec, env=prov,
                    copy_GBps=round(copy_GBps, 1), start_utc=provenance.utc_now())
        if not ok:
            recs += [dict(base, op=op, check=dict(status="WAIVED", error=why)) for op in a.op_list]
            continue
        try:
            fns, check = op_fns(spec, case, ref, E)
            err = check()
        except Exception as e:  # noqa: BLE001 - one impl failing must not stop the others
            err = f"{type(e).__name__}: {e}"
        for op in a.op_list:
            if not err and op not in fns:
                continue  # e.g. megatron has no permute_wait: it needs the row count
            rec = dict(base, op=op, check=dict(status="FAIL" if err else "PASS", error=err or None))
            if not err:
                fn = fns[op]
                st = measure(timer, fn, a)
                med = st.median_us
                nbytes = unique_bytes(op, T, H, R, case)
                rec.update(timing=dict(st.asdict(), l2_flush=timer.flushes),
                           bytes=nbytes, GBps=round(nbytes / med / 1e3, 1),
                           frac_of_copy=round(nbytes / med / 1e3 / copy_GBps, 3))
                if a.profile and timer.cuda:
                    rec["kernels"] = kernel_profile(fn, cuda=True).rows
                    rec["host_us"] = round(host_us(fn, cuda=True), 1)
                if a.trace and timer.cuda:
                    os.makedirs(a.trace, exist_ok=True)
                    write_trace(timer, fn, os.path.join(a.trace, f"{spec}-{op}-{T}x{H}x{K}x{E}.json"))
            rec["end_utc"] = provenance.utc_now()
            recs.append(rec)
    for r in recs:  # speedup over the anchors, same shape and op (their permute for permute_wait)
        mop = "permute" if r["op"].startswith("permute") else r["op"]
        for anchor in ("megatron", "te"):
            m = next((q for q in recs if q["impl"] == anchor and q["op"] == mop and "timing" in q), None)
            if m and "timing" in r:
                r[f"speedup_vs_{anchor}"] = round(m["timing"]["median_us"] / r["timing"]["median_us"], 2)
        if r["impl"] == "te" and "timing" in r:
            r["source"] = te_source.load()[1]
    return [PermuteRecord(**r).asdict() for r in recs]


@cli.tool
def main(argv=None) -> int:
    try:
        a = parse_args(argv)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        shapes = parse_shapes(a.shapes if a.shapes is not None else (DEFAULT_SHAPES if device.type == "cuda"
                                                                         else CPU_SHAPES))
        for T, H, K, E in shapes:
            w = Workload(num_tokens=T, hidden=H, num_experts=E, topk=K, ep=1, dtype=a.dtype)   # bad shape: exit 2
            too_big = memory_problem(w, device)
            if too_big:
                raise UsageError(f"--shapes {T}x{H}x{K}x{E}: {too_big}")
        bad = (cli.first_output_problem([(a.out, "--out"), (a.plot, "--plot"), (a.trace, "--trace", True)])
               or plots.plot_problem(a.plot, "--plot") or ops.env_problem() or variant_problem(a) or cannot_run(a))
        if bad:
            raise UsageError(bad)
    except (UsageError, WorkloadError) as e:
        cli.error("moebench.permute", e)
        return 2
    cli.text_to_stderr(a.out)
    if device.type == "cpu":
        print("# CPU run: functional check only; CPU times are not performance figures")
    cmd = provenance.repro_command(argv, "moebench.permute")
    prov = provenance.provenance()
    timer = Timer(device, flush_l2=not a.no_flush_l2)
    bw = bandwidths(timer, a)
    copy_GBps = bw["copy_GBps"]
    prov = dict(prov, **{k: round(v, 1) for k, v in bw.items()})
    print(f"# device {prov.get('gpu') or 'cpu'}; D2D copy {copy_GBps:.0f} GB/s (read + write), "
          f"write-only {bw['write_GBps']:.0f}, read-only {bw['read_GBps']:.0f}; median of "
          f"{a.iters}, L2 flush {'on' if timer.flushes else 'off'}")
    recs = []
    try:
        for n, shape in enumerate(shapes):
            mine = run_shape(shape, a, timer, copy_GBps, device, prov, cmd, f"shape {n + 1}/{len(shapes)} ")
            if a.out:
                writer.write_jsonl(a.out, mine)      # on disk as each shape finishes
            recs += mine
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except KeyboardInterrupt as e:
        kept = f"{len(recs)} records of {n} shape(s) kept in {a.out}" if a.out else "no --out given"
        left = ", ".join("x".join(map(str, s)) for s in shapes[n:])
        raise cli.Interrupted.after(e, f"{kept}; not run: {left}") from None
    print(tables.format_permute(recs))
    if a.out:
        print(f"# {len(recs)} records appended to {a.out} as each shape finished")
    if a.plot and not any("timing" in r for r in recs):
        print(f"# no plot written to {a.plot}: no row was timed")
    elif a.plot:
        plots.plot_permute(recs, copy_GBps, a.plot)
        print(f"# plot written to {a.plot}")
    return 1 if any(r["check"]["status"] == "FAIL" for r in recs) else 0


if __name__ == "__main__":
    sys.exit(cli.run(main, "moebench.permute"))
