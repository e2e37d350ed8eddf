"""Timing views (README.md, "Timing views"): what is inside a phase's time, named in every record.

  api     what a training step pays for one call (layout, metadata, host waits, local permute):
          barrier before each call, per-iteration max over ranks, median (timing.Timer.run).
  cached  the backend's call repeated with the checked dispatch's handle / metadata reused, as
          DeepEP's test_intranode and HybridEP's test time it: calls queued back to back, the
          mean of the iterations after the first (DeepEP tests/utils.py `bench`), per rank; the
          record keeps rank 0's (what those tests print) and the max over ranks.
  kernel  the communication kernels alone, from the profiler: their device time per call,
          averaged over the profiled calls (DeepEP's `bench_kineto`), per rank; rank 0 and max.
A view a backend cannot give is recorded as {"none": why}.
"""
from __future__ import annotations

import statistics

from .timing import Timer, kernel_profile

VIEWS = ("api", "cached", "kernel")
CACHED_AGG = "mean of back-to-back calls after the first (DeepEP tests/utils.py bench); rank 0 and max over ranks"
KERNEL_AGG = ("device time of the communication kernels per call, mean over profiled calls (DeepEP "
              "bench_kineto); rank 0 and max over ranks")
API_AGG = "median over iterations of the per-iteration max over ranks, a barrier before each call"


def none(why: str) -> dict:
    return {"none": why}


def _per_rank(timer: Timer, value: float, rank: int, *more: float) -> list[float]:
    """[rank 0's value, max over ranks, max over ranks of each of `more`], in one collective;
    every rank must call this."""
    return timer.agree_max([value if rank == 0 else 0.0, value, *more])


def cached(timer: Timer, fn, iters: int, warmup_ms: float, rank: int) -> dict:
    timer.warmup(fn, warmup_ms)
    times = timer.queued(fn, max(iters, 2) + 1)[1:]
    r0, mx = _per_rank(timer, statistics.fmean(times) * 1e6, rank)
    return {"mean_us": r0, "max_over_ranks_us": mx, "iters": len(times), "aggregation": CACHED_AGG}


def comm_kernel_us(rows: list[dict], names: tuple[str, ...]) -> tuple[float, list[str]]:
    """Device us per call of the kernels whose name holds one of `names`, and those kernels."""
    hit = [r for r in rows if any(n in r["kernel"] for n in names)]
    return sum(r["us_per_iter"] for r in hit), [r["kernel"] for r in hit]


def kernel(timer: Timer, rows: list[dict], names: tuple[str, ...], rank: int) -> dict:
    """The kernel view from a phase's full kernel profile (`rows`); every rank must call this."""
    us, hit = comm_kernel_us(rows, names)
    r0, mx, found = _per_rank(timer, us, rank, 1.0 if hit else 0.0)   # found: on any rank
    if not found:
        return none(f"no kernel named like {', '.join(names)} ran (e.g. EP 1, or gloo moves the bytes)")
    return {"us": r0, "max_over_ranks_us": mx, "kernels": hit, "aggregation": KERNEL_AGG}


def profile(fn, timer: Timer) -> list[dict]:
    """Every kernel of the call (timing.kernel_profile, untruncated)."""
    return kernel_profile(fn, timer.cuda, top=0)


def host_split(median_us: float, rows: list[dict]) -> dict:
    """Host time of a phase: what its api median holds beyond the sum of its kernels."""
    ksum = sum(r["us_per_iter"] for r in rows)
    return {"kernel_sum_us": ksum, "host_us": median_us - ksum}
