"""One case, one backend: check against the oracle on every rank, then time each phase.

Each backend runs in its own launch of rank processes, so one that crashes or hangs is reported
FAIL and the next backend still runs. Rank results come back to the parent, which applies the
byte rule (traffic.py) and builds the JSONL records (records/schema.DispatchRecord).

`run_cases` runs several cases of one backend in one launch (the same ranks set each case up, check
and time it, tear it down, then take the next): the start of the rank processes, their imports and
the backend's in-process JIT caches are paid once, not per case (the GPU tier's oracle cases).
"""
from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field

from ..backends import base
from ..core import digest, reference, traffic
from ..core.workload import WorkloadError, make_routing, rank_inputs
from ..records import dispatch as records, provenance
from ..records.schema import PHASES
from ..records.shapes import Repeat
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
    inputs_sha256: dict | None = None               # {routing, payload}: core/digest.py over every rank's inputs
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
    out.inputs_sha256 = digest.combine(memory.gather(digest.inputs(idx, wt, inputs[0], s), ctx.group))
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
    rows = sum(reference.counts(d.tokens_per_expert))        # the received rows (not a budget's or slots' size)
    gemm = overlap.Gemm(overlap.gemm_shape(overlap.parse(spec.overlap), rows, spec.workload.hidden),
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
    """Every backend of the spec on its workload, `spec.repeats` times (each backend's ranks started afresh every
    time, the backend order rotated by one every repeat); returns the JSONL records (rank 0's view).
    argv: the command line to record (default: the spec's own, `spec.to_argv()`).
    sink(name, records): called as each backend finishes, with its records (the tools write them then)."""
    run = CaseRun(spec, spec.to_argv() if argv is None else argv, progress, sink)
    why = {name: waiver(name, spec) for name in spec.backends}
    for rep in range(spec.repeats):
        order = rotated(spec.backends, rep)
        tag = Repeat(rep, spec.repeats, list(order), run.id).asdict() if spec.repeats > 1 else None
        first = None                                  # (name, inputs_sha256) of this repeat's first backend that ran
        for name in order:
            if why[name] and rep:                     # WAIVED once, not once per repeat
                continue
            res = run.result(name, why[name], rep)
            if res is None:
                continue
            if res.inputs_sha256:
                first = first or (name, res.inputs_sha256)
                if bad := inputs_differ(first, name, res.inputs_sha256, rep):
                    res.status, res.error = "FAIL", bad
            run.emit(name, res, tag, soak=rep == 0)
    return run.recs


def rotated(names, rep: int) -> tuple[str, ...]:
    """The backend order of repeat `rep`: rotated left by `rep` (every backend runs first, last, in between)."""
    k = rep % max(len(names), 1)
    return tuple(names[k:]) + tuple(names[:k])


def inputs_differ(first: tuple[str, dict], name: str, sha: dict, rep: int) -> str:
    """'' when `name` was given the same inputs as the repeat's first backend, else why its records are refused
    (a comparison between them would compare two workloads)."""
    other, want = first
    diff = [k for k in sorted(want) if want.get(k) != sha.get(k)]
    if not diff:
        return ""
    k = diff[0]
    return (f"refused: repeat {rep + 1} gave {name} other inputs than {other}: {k} SHA-256 {sha.get(k, '-')[:16]} "
            f"vs {want[k][:16]} (a comparison needs the same inputs on every backend)")


class CaseRun:
    """One case's backends and repeats: what they share (the byte rule's count, the measured ceiling, the
    records so far)."""

    def __init__(self, spec: RunSpec, argv: list[str], progress, sink):
        w = spec.workload
        self.spec, self.argv, self.progress, self.sink = spec, argv, progress, sink
        self.t = traffic.traffic_of([make_routing(w, r)[0] for r in range(w.ep)], w)
        self.rank_pairs = self.t.pairs_SD.sum(0).tolist()
        self.measured, self.recs = None, []
        self.start = provenance.utc_now()              # of the backend running now (result)
        self.id = f"{self.start}-{os.getpid()}"

    def result(self, name: str, why: str, rep: int) -> RankResult | None:
        """The backend's RankResult (WAIVED with `why` when it cannot run), None on a job's other ranks."""
        self.start = provenance.utc_now()
        if why:
            return RankResult("WAIVED", why)
        spec = self.spec
        again = f"repeat {rep + 1} of {spec.repeats}: " if spec.repeats > 1 else ""
        self.progress(f"# {again}running {name} on EP {spec.workload.ep} ...")
        measure = spec.measure_ceiling and not spec.functional and self.measured is None   # NCCL only
        with environment(spec.env):
            res = run_backend(spec, name, measure=measure, rank_pairs=self.rank_pairs)
        self.measured = self.measured or (res.a2a if res else None)
        return res

    def emit(self, name: str, res: RankResult, repeat: dict | None, soak: bool = True) -> None:
        """The backend's records to the sink and the list; then its soak (--soak), where it passed."""
        spec, dedup = self.spec, base.get(name).dedup
        mine = records.build(spec, name, dedup, res, self.t, self.measured, self.argv, self.start, repeat)
        if spec.soak and soak and res.status == "PASS":
            if self.sink is not None:       # the timed records on disk before the soak, which may crash or hang
                self.sink(name, mine)
            self.recs += mine
            self.progress(f"# soaking {name}: {spec.soak} calls on fresh routing, each checked ...")
            ranks, err, crash = run_soak(spec, name)
            mine = records.build_soak(spec, name, dedup, ranks, err, crash, self.argv, provenance.utc_now())
        if self.sink is not None:
            self.sink(name, mine)
        self.recs += mine


def rank_cases(ctx: RankContext, cases: list) -> list[RankResult]:
    """rank_main for each (spec, name, rank_pairs) in turn, on the same ranks (stage() keeps a failing case's
    ranks together, so the next case still runs)."""
    return [rank_main(ctx, spec, name, False, pairs) for spec, name, pairs in cases]


def run_cases(specs: list[RunSpec], name: str) -> list[list[dict]]:
    """Backend `name` on each spec, the cases that are not WAIVED in one launch of rank processes; each case's
    records, as run_case builds them (no soak, no measured ceiling). The specs must share what the launch
    fixes: EP, device, ranks per GPU and the rank processes' environment. A crash or timeout fails every case
    of the launch, with its reason."""
    fixed = {(s.workload.ep, s.device, s.ranks_per_gpu, tuple(sorted(s.env.items()))) for s in specs}
    if len(fixed) != 1:
        raise ValueError(f"run_cases: one launch cannot serve {len(fixed)} settings of EP / device / ranks per GPU / "
                         "environment")
    start, plans = provenance.utc_now(), []
    for s in specs:
        t = traffic.traffic_of([make_routing(s.workload, r)[0] for r in range(s.workload.ep)], s.workload)
        plans.append((s, t, t.pairs_SD.sum(0).tolist(), waiver(name, s)))
    runs = [(s, name, pairs) for s, _, pairs, why in plans if not why]
    first = specs[0]
    try:
        with environment(first.env):
            outs = run_ranks(rank_cases, first.workload.ep, first.device, first.timeout_s * max(1, len(runs)),
                             args=(runs,), ranks_per_gpu=first.ranks_per_gpu) if runs else []
        done = iter(outs[0] if outs else [None] * len(runs))
    except LaunchError as e:
        done = iter([RankResult("FAIL", str(e).splitlines()[0][:1500], crash=e.crash)] * len(runs))
    out = []
    for s, t, _, why in plans:
        res = RankResult("WAIVED", why) if why else next(done)
        out.append([] if res is None else
                   records.build(s, name, base.get(name).dedup, res, t, None, s.to_argv(), start))
    return out


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
