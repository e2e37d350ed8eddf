"""The kernel profile every view that looks at kernels reads (api, kernel, cached): one phase's kernels
per call, from the profiler (timing.kernel_profile)."""
from __future__ import annotations

from ..timing import KernelProfile, Timer, kernel_profile

KERNEL_ROWS = 8      # the largest kernels of a phase (or of its cached call) kept in the record


def profile(fn, timer: Timer, flushed: bool = False) -> KernelProfile:
    """Every kernel of the call (untruncated) and the GPU time they cover: calls back to back, or (flushed) each
    behind the timer's L2 flush as the api, cached and graph views time it."""
    lead = timer.lead if (flushed and timer.flushes) else None
    return kernel_profile(fn, timer.cuda, top=0, lead=lead)


def host_split(median_us: float, prof: KernelProfile) -> dict:
    """Host time of a phase: what its api median holds beyond the GPU time its kernels cover (their sum where
    the overlap is unknown). The kernels are profiled in calls of their own (a profiler inside the timed
    iterations would time itself too), so where they cover more than the median, the host time is within the
    noise of two samplings: host_us is then None and `host_note` says by how much, never a negative time."""
    ksum = sum(r["us_per_iter"] for r in prof.rows)
    busy = prof.busy_us if prof.busy_us is not None else ksum
    out = {"kernel_sum_us": ksum, "kernel_busy_us": prof.busy_us, "host_us": median_us - busy}
    if out["host_us"] < 0:
        out["host_us"] = None
        out["host_note"] = (f"within noise: the kernels cover {busy:.1f} us in calls profiled apart, "
                            f"{busy - median_us:.1f} us ({(busy - median_us) / median_us:.1%}) above the api median")
    return out


def per_rank(timer: Timer, value: float, rank: int, *more: float) -> list[float]:
    """[rank 0's value, max over ranks, max over ranks of each of `more`], in one collective; every rank
    must call this."""
    return timer.agree_max([value if rank == 0 else 0.0, value, *more])
