"""One case, one backend: check against the oracle on every rank, then time each phase.

Each backend runs in its own launch of rank processes, so one that crashes or hangs is reported
FAIL and the next backend still runs. Rank results come back to the parent, which applies the
byte rule (traffic.py) and builds the JSONL records (records/schema.DispatchRecord).
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from ..backends import base
from ..core import traffic
from ..core.workload import WorkloadError, make_routing, rank_inputs
from ..records import dispatch as records, provenance
from ..records.schema import PHASES
from . import fault, memory, oracle, overlap, preflight, setupcost, views
from .launch import LaunchError, RankContext, environment, run_ranks, set_pg_timeout
from .soak import run_soak
from .spec import RunSpec
from .stage import WAIVED, CheckFailed, make_backend, make_case, stage
from .timing import Timer, measure_alltoall


@dataclass
class RankResult:
    """What one rank returns for one backend (rank 0's goes into the records)."""
    status: str = "FAIL"                            # PASS | FAIL | WAIVED
    error: str = ""
    phases: dict = field(default_factory=dict)      # phase -> the api view's Timing dict (+ figures across views)
    views: dict = field(default_factory=dict)       # phase -> {view: its shape}
    kernels: dict = field(default_factory=dict)     # phase -> its largest kernels per call
    overlap: dict = field(default_factory=dict)     # phase -> the Overlap dict (--overlap)
    knobs: dict = field(default_factory=dict)
    version: str = ""
    a2a: tuple | None = None                        # the measured NCCL all_to_all ceiling (NCCL runs)
    bypassed: list = field(default_factory=list)    # checks skipped for shared-GPU ranks
    native_bytes: dict | None = None                # the backend's own byte count beside its rule's expectation
    crash: str | None = None                        # the signal that killed a rank, or "hang"
    memory: list = field(default_factory=list)      # every rank's memory figures (harness/memory.py)
    setup: list = field(default_factory=list)       # every rank's setup cost (harness/setupcost.py)
    fault: object = None                            # --inject: what was seen (records/shapes.Fault)


def rank_main(ctx: RankContext, spec: RunSpec, name: str, measure: bool,
              rank_pairs: list[int] | None = None) -> RankResult:
    """Runs on every rank: set up, check against the oracle, time every view (harness/views), each part's setup
    cost (harness/setupcost.py). rank_pairs: received (token, rank) pairs per rank (the byte rule's count); the
    backend's own byte count of the checked dispatch must equal them times the bytes per row of its own rule."""
    out = RankResult(version=base.get(name).version())
    dev, w = ctx.device, spec.workload
    x, idx, wt, q, s = rank_inputs(w, ctx.rank, dev)
    inputs = (q if q is not None else x, idx, wt, s)
    meter = memory.Meter(dev)
    meter.before()
    clock = {"rank": ctx.rank, "group_ms": round(ctx.group_ms, 3) if ctx.group_ms is not None else None}
    b, err = make_backend(spec, name, ctx, clock)
    meter.after_setup()
    first, checked = setupcost.FirstCalls(b, dev), {}
    err = err or stage(lambda: _check(first, spec, name, ctx, inputs, rank_pairs, out, checked), ctx.group)
    out.bypassed = list(b.bypassed) if b else []
    if b is not None and not err:
        out.knobs = b.knobs()
    if err:
        _teardown(b)
        out.setup = setupcost.gather(clock, first, ctx.group)
        out.status, out.error = ("WAIVED", err.removeprefix(WAIVED)) if err.startswith(WAIVED) else ("FAIL", err)
        return out
    timer = Timer.for_run(spec, dev, ctx.group)
    case = make_case(b, timer, ctx, spec, inputs, checked["d"], checked["y"])
    case.fault = fault.injector(spec.fault_plan, ctx.rank)
    if spec.inject:         # the stack's own timeout from the timed calls on (setup and JIT compiles keep --timeout's)
        set_pg_timeout(spec.pg_timeout, ctx.group)
    meter.timed()
    out.views = views.run_all(case, spec.views, after_api=meter.api_done)
    out.memory = memory.gather(meter.result(ctx.rank), ctx.group)
    out.phases, out.kernels = case.timing, {p: r[:views.KERNEL_ROWS] for p, r in case.rows.items()}
    if spec.overlap:
        out.overlap = _overlap(case, ctx)
    if measure:
        bytes_per_rank = w.num_tokens * w.topk * w.bytes_per_token
        out.a2a = measure_alltoall(timer, ctx.group, dev, bytes_per_rank, spec.iters)
    bad = views.failure(out.views)
    if spec.recreate:
        b, churn, bad_again = setupcost.recreate(spec, name, ctx, b, inputs)
        clock.update(churn)
        bad = bad or bad_again
    out.setup = setupcost.gather(clock, first, ctx.group)
    if b is not None:
        b.teardown()
        out.knobs = b.knobs()
    out.status, out.error = ("FAIL" if bad else "PASS"), bad
    return out


def _check(b, spec: RunSpec, name: str, ctx: RankContext, inputs: tuple, rank_pairs, out: RankResult,
           checked: dict) -> None:
    """The first dispatch and combine through the oracle (b: the backend, its first calls timed), and the backend's
    own byte count of the dispatch against the byte rule's (Backend.native_rule); CheckFailed with why."""
    w = spec.workload
    msg, checked["d"], checked["y"] = oracle.check(b, w, ctx.rank, *inputs, ctx.device)
    if msg:
        raise CheckFailed(msg)
    native = b.native_bytes(checked["d"])
    if native is not None and rank_pairs is not None:
        row_bytes, rule = b.native_rule(w)
        want = rank_pairs[ctx.rank] * row_bytes
        out.native_bytes = {"backend": native, "expected": want, "rule": rule}
        if native != want:
            raise CheckFailed(f"byte rule: rank {ctx.rank} received {native} bytes by {name}'s own count of its "
                              f"outputs, {want} by {rule} ({rank_pairs[ctx.rank]} rows x {row_bytes} bytes)")


def _overlap(case: views.Case, ctx) -> dict:
    """Each phase under a concurrent GEMM (--overlap), beside its api time."""
    spec, d = case.spec, case.d
    gemm = overlap.Gemm(overlap.gemm_shape(overlap.parse(spec.overlap), d.x_RH.shape[0], spec.workload.hidden),
                        ctx.device)
    return {p: overlap.measure(case.timer, case.phases[p], gemm, case.stats[p].median_us, spec.iters, spec.warmup_ms)
            for p in PHASES}


def _teardown(b) -> None:
    """Release a backend's buffers after a failure too (DeepEP's destructor may hang otherwise)."""
    try:
        if b is not None:
            b.teardown()
    except Exception:  # noqa: BLE001 - the failure already reported is the one that matters
        traceback.print_exc()


def run_backend(spec: RunSpec, name: str, measure: bool, rank_pairs: list[int] | None = None) -> RankResult | None:
    """Launch the ranks for one backend; a crash or timeout becomes a FAIL result, and so does an injected fault,
    saying what was seen (harness/fault.py). None on the other ranks of a torchrun/srun job (rank 0 reports)."""
    watch = fault.Watch(spec.fault_plan, spec.watchdog) if spec.inject else None
    try:
        outs = run_ranks(rank_main, spec.workload.ep, spec.device, spec.timeout_s,
                         args=(spec, name, measure, rank_pairs), ranks_per_gpu=spec.ranks_per_gpu,
                         pg_timeout_s=None if spec.inject else spec.pg_timeout, watch=watch)
        res = outs[0] if outs else None
    except LaunchError as e:
        res = RankResult("FAIL", str(e).splitlines()[0][:1500], crash=e.crash)
    if watch is not None and res is not None:
        fault.judge(watch, res)
    return res


def run_case(spec: RunSpec, argv: list[str] | None = None, progress=print, sink=None) -> list[dict]:
    """Every backend of the spec on its workload; returns the JSONL records (rank 0's view).
    argv: the command line to record (default: the spec's own, `spec.to_argv()`).
    sink(name, records): called as each backend finishes, with its records (the tools write them then)."""
    w = spec.workload
    argv = spec.to_argv() if argv is None else argv
    t = traffic.traffic_of([make_routing(w, r)[0] for r in range(w.ep)], w)
    rank_pairs = t.pairs_SD.sum(0).tolist()
    recs, measured = [], None
    for name in spec.backends:
        start = provenance.utc_now()
        why = waiver(name, spec)
        if why:
            res = RankResult("WAIVED", why)
        else:
            progress(f"# running {name} on EP {w.ep} ...")
            measure = spec.measure_ceiling and not spec.functional and measured is None   # NCCL only
            with environment(spec.env):
                res = run_backend(spec, name, measure=measure, rank_pairs=rank_pairs)
            measured = measured or (res.a2a if res else None)
        if res is None:
            continue
        mine = records.build(spec, name, base.get(name).dedup, res, t, measured, argv, start)
        if spec.soak and res.status == "PASS":
            if sink is not None:       # the timed records on disk before the soak, which may crash or hang
                sink(name, mine)
            recs += mine
            progress(f"# soaking {name}: {spec.soak} calls on fresh routing, each checked ...")
            ranks, err, crash = run_soak(spec, name)
            mine = records.build_soak(spec, name, base.get(name).dedup, ranks, err, crash, argv, provenance.utc_now())
        if sink is not None:
            sink(name, mine)
        recs += mine
    return recs


def waiver(name: str, spec: RunSpec) -> str:
    """Why a backend is WAIVED before any rank starts ('' when it runs): its package is missing, or
    it cannot take this shape (with `--backend all`; a named backend that cannot is bad input)."""
    cls = base.get(name)
    ok, why = cls.available()
    if not ok:
        return why
    try:
        cls(knob_values=spec.backend_knobs).validate(spec.workload, spec.workload.ep)
    except WorkloadError as e:
        return f"cannot take this run: {e}"
    return preflight.waiver(name, spec)      # pre-launch checks: CUDA-only backends, memory (preflight.py)
