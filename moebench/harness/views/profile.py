"""The kernel profile every view that looks at kernels reads (api, kernel, cached): one phase's kernels
per call, from the profiler (timing.kernel_profile)."""
from __future__ import annotations

from ..timing import Timer, kernel_profile

KERNEL_ROWS = 8      # the largest kernels of a phase (or of its cached call) kept in the record


def profile(fn, timer: Timer, flushed: bool = False) -> list[dict]:
    """Every kernel of the call (untruncated): calls back to back, or (flushed) each behind the timer's L2
    flush as the api, cached and graph views time it."""
    lead = timer.lead if (flushed and timer.flushes) else None
    return kernel_profile(fn, timer.cuda, top=0, lead=lead)


def host_split(median_us: float, rows: list[dict]) -> dict:
    """Host time of a phase: what its api median holds beyond the sum of its kernels."""
    ksum = sum(r["us_per_iter"] for r in rows)
    return {"kernel_sum_us": ksum, "host_us": median_us - ksum}


def per_rank(timer: Timer, value: float, rank: int, *more: float) -> list[float]:
    """[rank 0's value, max over ranks, max over ranks of each of `more`], in one collective; every rank
    must call this."""
    return timer.agree_max([value if rank == 0 else 0.0, value, *more])
