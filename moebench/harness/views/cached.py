"""cached: the backend's call repeated with the checked dispatch's handle / metadata reused, as DeepEP's
test_intranode and HybridEP's test time it: calls queued back to back, the mean of the iterations after
the first (DeepEP tests/utils.py `bench`), per rank; `us` is rank 0's (what those tests print). On CUDA
also the cached call's own kernels, each call behind the L2 flush: what the graph view replays, and the
floor of both. Backend hook: `cached_phases` (and `no_cached_view`, why a backend has none)."""
from __future__ import annotations

import statistics

from . import PHASES, Case, figure, none
from .profile import KERNEL_ROWS, per_rank, profile

NAME, ORDER, SAMPLED = "cached", 1, True
ABOUT = "the call with its handle reused"
AGG = "mean of back-to-back calls after the first (DeepEP tests/utils.py bench); rank 0, and max over ranks"


def run(case: Case) -> dict:
    b = case.backend
    calls = b.cached_phases(*case.inputs, case.d, case.y)
    return {p: one(case, calls[p]) if p in calls else none(b.no_cached_view) for p in PHASES}


def one(case: Case, fn) -> dict:
    timer, spec = case.timer, case.spec
    timer.warmup(fn, spec.warmup_ms)
    times = timer.queued(fn, max(spec.iters, 2) + 1)[1:]
    r0, mx = per_rank(timer, statistics.fmean(times) * 1e6, case.rank)
    per_iter = timer.agree_max([t * 1e6 for t in times])       # for A/B verdicts on this view (report, flags)
    extra = {}
    if timer.cuda:
        rows, busy = profile(fn, timer, flushed=True)
        mine = [sum(r["us_per_iter"] for r in rows), -1.0 if busy is None else busy]
        ksum, busy = timer.agree_max(mine if case.rank == 0 else [float("-inf")] * 2)      # rank 0's, as api's
        extra = {"kernel_sum_us": ksum, "kernel_busy_us": busy if busy >= 0 else None, "kernels": rows[:KERNEL_ROWS]}
    return figure(r0, mx, AGG, per_iter, iters=len(times), **extra)
