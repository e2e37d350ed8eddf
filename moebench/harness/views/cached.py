"""cached: the backend's call repeated with the checked dispatch's handle / metadata reused, as DeepEP's
test_intranode and HybridEP's test time it: calls queued back to back, the mean of the iterations after
the first (DeepEP tests/utils.py `bench`), per rank; `us` is rank 0's (what those tests print). On CUDA
also the cached call's own kernels, each call behind the L2 flush: what the graph view replays, and the
floor of both. Backend hooks: `cached_phases` (and `no_cached_view`, why a backend has none); `cached_loop`
"ep_bench": timed as NCCL EP's ep_bench times its calls instead (ep_bench.cu runPairedBenchmark: per iteration
dispatch then combine, CUDA events around each launch, a stream sync between, a barrier after; the mean of the
iterations after the first; no L2 flush)."""
from __future__ import annotations

import statistics

from . import PHASES, Case, across, figure, none
from .profile import KERNEL_ROWS, per_rank, profile

NAME, ORDER, SAMPLED = "cached", 1, True
ABOUT = "the call with its handle reused"
AGG = "mean of back-to-back calls after the first (DeepEP tests/utils.py bench); rank 0, and max over ranks"
EP_BENCH_AGG = ("ep_bench's paired loop (runPairedBenchmark): per iteration dispatch then combine, CUDA events around "
                "each launch, a stream sync between, a barrier after, no L2 flush; mean of the iterations after the "
                "first; rank 0, and max over ranks")


def run(case: Case) -> dict:
    b = case.backend
    calls = b.cached_phases(*case.inputs, case.d, case.y)
    if b.cached_loop == "ep_bench" and set(PHASES) <= set(calls):
        times = paired(case, calls)
        return {p: one(case, calls[p], times[p]) for p in PHASES}
    return {p: one(case, calls[p]) if p in calls else none(b.no_cached_view) for p in PHASES}


def paired(case: Case, calls: dict) -> dict[str, list[float]]:
    """Seconds per call of each phase, ep_bench's way: the pair warmed up, then per iteration each phase timed
    alone (events around its launch, a sync after it), a barrier after the pair; the first iteration dropped."""
    timer, spec = case.timer, case.spec
    timer.warmup(lambda: [calls[p]() for p in PHASES], spec.warmup_ms)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(max(spec.iters, 2) + 1):
        for p in PHASES:
            times[p].append(timer.alone(calls[p]))
        timer.barrier()
    return {p: t[1:] for p, t in times.items()}


def one(case: Case, fn, times: list[float] | None = None) -> dict:
    """The view of one phase; `times`: already taken (the ep_bench loop), else the calls queued back to back."""
    timer, spec = case.timer, case.spec
    agg = EP_BENCH_AGG if times is not None else AGG
    if times is None:
        timer.warmup(fn, spec.warmup_ms)
        times = timer.queued(fn, max(spec.iters, 2) + 1)[1:]
    r0, mx = per_rank(timer, statistics.fmean(times) * 1e6, case.rank)
    per_iter, tails = across(timer, [t * 1e6 for t in times])     # for A/B verdicts on this view (report, flags)
    extra = {}
    if timer.cuda:
        rows, busy = profile(fn, timer, flushed=True)
        mine = [sum(r["us_per_iter"] for r in rows), -1.0 if busy is None else busy]
        ksum, busy = timer.agree_max(mine if case.rank == 0 else [float("-inf")] * 2)      # rank 0's, as api's
        extra = {"kernel_sum_us": ksum, "kernel_busy_us": busy if busy >= 0 else None, "kernels": rows[:KERNEL_ROWS]}
    return figure(r0, mx, agg, per_iter, iters=len(times), **tails, **extra)
