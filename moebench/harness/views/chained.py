"""chained: dispatch -> combine round trips that the host queues back to back with no sync between them,
free-running, as CollectiveX times its headline pair period (SemiAnalysisAI/InferenceX@843c625,
experimental/CollectiveX/bench/ep_backend.py `benchmark_chain`, docs/methodology.md "Chained Pair Period"): a
decode loop never drains between layers, so entry skew amortises over the chain instead of landing on one call.
CUDA events around each pair and nothing between its two calls (CPU: host clock), the first pairs dropped as
pipeline fill (CollectiveX: 16 of 128), one window per kept pair.

Across ranks: `us` is the median over pairs of the per-pair max over ranks (the slowest rank, as every other view);
`median_over_ranks_us` is CollectiveX's own reduction, the per-pair median over ranks (its `pair_period`: the
pairs phase-lock the ranks into one cadence, so it reads the median as the rate); `spread_us` the median per-pair
max - min over ranks (large next to the period: a paced rank, as its `pair_spread_us`). The figure is one round
trip, so both phase records carry the same view; it keeps its samples but is not SAMPLED: the A/B verdicts sum a
view's dispatch and combine, which would count it twice. The last pair's outputs go through the oracle after
the closing sync (CollectiveX checks the chain's final output too): wrong data is {"fail": why}. Backend hook:
`chained_plan` (its pair without a host sync, or why it has none).

A pair whose correctness expert must run between its two calls (plan.between: ncclep, whose zero-copy rows and ll
slots belong to one dispatch) has that step timed by its own events and taken out of each window (`between_us`: its
median): the expert is moebench's stand-in, not the library's work (at 565af70 it was in: ncclep ll's pair read
19.9 ms against its 0.6 + 0.55 ms api phases, the stand-in sweeping the whole 31 GiB slot buffer).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ...records.shapes import Tails, quantile
from ..timing import Timer, agree_error
from . import PHASES, Case, fail, figure, none
from .graph import _done

NAME, ORDER, SAMPLED = "chained", 2.5, False       # after kernel, before graph (which runs last)
ABOUT = "dispatch -> combine pairs back to back, no host sync between them (CollectiveX's pair period)"
CHAIN_PAIRS, CHAIN_DROP = 128, 16                  # CollectiveX's --chain-iters and --chain-drop (ep_harness.py)
AGG = ("dispatch -> combine pairs queued back to back with no host sync, each pair between two CUDA events (CPU: "
       "host clock), the first pairs dropped as pipeline fill; us: median over pairs of the per-pair max over ranks; "
       "median_over_ranks_us: the per-pair median over ranks (CollectiveX's pair_period); one round trip")


def chain_length(iters: int, cuda: bool) -> tuple[int, int]:
    """(pairs kept, pairs dropped first): CollectiveX's 128 - 16 on a GPU (more kept when --iters asks more); a
    CPU run (functional) keeps --iters after one."""
    return (max(iters, CHAIN_PAIRS - CHAIN_DROP), CHAIN_DROP) if cuda else (max(iters, 2), 1)


def run(case: Case) -> dict:
    timer, spec, b = case.timer, case.spec, case.backend
    both = lambda v: {p: v for p in PHASES}  # noqa: E731
    try:
        plan, err = b.chained_plan(*case.inputs, case.d, case.y), ""
    except Exception as e:  # noqa: BLE001 - a pair that cannot even be built is a view that does not exist
        plan, err = None, f"no chained pair: {type(e).__name__}: {str(e)[:300]}"
    err = agree_error(err or (plan if isinstance(plan, str) else ""), timer.group)
    if err:
        return both(none(err))
    kept, drop = chain_length(spec.iters, timer.cuda)
    out = chain(timer, plan, kept, drop, case.check, wait_s=min(120.0, spec.timeout_s / 4), warmup_ms=spec.warmup_ms)
    return both(out)


def _pair(plan, mark=None):
    """One dispatch -> combine; mark(0) / mark(1) around the between step, where the plan has one."""
    d = plan.dispatch()
    if plan.between:
        mark and mark(0)
        plan.between(d)
        mark and mark(1)
    return d, plan.combine(d)


def chain(timer: Timer, plan, kept: int, drop: int, check, wait_s: float, warmup_ms: float = 0.0) -> dict:
    """One free-running chain of drop + kept pairs of `plan` (a backends.base.GraphPlan) on every rank, its view:
    the per-pair windows reduced over ranks, the last pair's outputs checked (check(d, y) -> '' or the oracle's
    complaint). Every rank calls this."""
    if timer.cuda:              # a CPU run's first, dropped pair is its warm-up (the CPU tier pays for every call)
        timer.warmup(lambda: _pair(plan), warmup_ms)
    timer.barrier()
    n, marks = drop + kept, 4 if plan.between else 2        # start, [before between, after between,] end
    if timer.cuda:
        ev = [[torch.cuda.Event(enable_timing=True) for _ in range(marks)] for _ in range(n)]
        for e in ev:
            e[0].record()
            d, y = _pair(plan, lambda i, e=e: e[1 + i].record())
            e[-1].record()
        if not _done(ev[-1][-1], wait_s):
            return fail(f"a chain of {n} pairs did not finish within {wait_s:.0f} s (hang)")
        span = lambda e, a, b: e[a].elapsed_time(e[b]) * 1e3  # noqa: E731
    else:
        ev = []
        for _ in range(n):
            e = [time.perf_counter()] + [0.0] * (marks - 1)
            d, y = _pair(plan, lambda i, e=e: e.__setitem__(1 + i, time.perf_counter()))
            e[-1] = time.perf_counter()
            ev.append(e)
        span = lambda e, a, b: (e[b] - e[a]) * 1e6  # noqa: E731
    between_us = [span(e, 1, 2) for e in ev] if plan.between else [0.0] * n
    window_us = [span(e, 0, marks - 1) - x for e, x in zip(ev, between_us)]
    try:
        bad = check(d, y)
    except Exception as e:  # noqa: BLE001 - outputs the oracle cannot even read are wrong outputs
        bad = f"outputs unreadable: {type(e).__name__}: {e}"
    bad = agree_error(bad, timer.group)
    if bad:
        return fail(f"the chain's last pair: {bad}")
    per_rank = _gather(timer, window_us[drop:])              # [W, kept]
    slowest, middle = per_rank.max(0).values.tolist(), per_rank.median(0).values.tolist()
    spread = (per_rank.max(0).values - per_rank.min(0).values).tolist()
    extra = {"between": "the correctness expert on the received rows, timed apart and taken out of each window",
             "between_us": statistics.median(between_us[drop:])} if plan.between else {}
    return figure(statistics.median(slowest), statistics.median(slowest), AGG, slowest,
                  median_over_ranks_us=quantile(sorted(middle), 0.5), spread_us=statistics.median(spread),
                  pairs=kept, dropped=drop, mode=plan.mode, covers="dispatch -> combine round trip",
                  **Tails.of(per_rank.tolist()).asdict(), **extra)


def _gather(timer: Timer, values: list[float]) -> torch.Tensor:
    """Every rank's values as one [W, n] float64 tensor, in rank order (one all_gather)."""
    mine = torch.tensor(values, dtype=torch.float64, device=timer.device if timer.cuda else "cpu")
    group = timer.group
    if group is None or dist.get_world_size(group) == 1:
        return mine[None].cpu()
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, mine, group=group)
    return torch.stack(rows).cpu()
