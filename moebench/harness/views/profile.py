"""The kernel profile every view that looks at kernels reads (api, kernel, cached): one phase's kernels
per call, from the profiler (timing.kernel_profile)."""
from __future__ import annotations

from ...ops import CUDA_KERNELS, TRITON_KERNELS
from ..timing import KernelProfile, Timer, kernel_profile

KERNEL_ROWS = 8      # the largest kernels of a phase (or of its cached call) kept in the record
OWNERS = ("library", "moebench", "torch")
TORCH = ("at::", "at_cuda_detail::", "c10::", "Memcpy", "Memset", "aten::", "cudaMemcpy", "cudaMemset")


def owner(kernel: str) -> str:
    """Whose kernel a profiler row is: "moebench" (its CUDA extension's, its Triton kernels, its torch.library ops on
    CPU), "torch" (torch's own kernels and the runtime's copies and fills, whoever queued them: glue a library or
    moebench runs through torch), else "library" (the backend's own: NCCL, NCCL EP, DeepEP, HybridEP, Megatron's
    fused kernels)."""
    if kernel in TRITON_KERNELS or kernel.startswith("moebench::") or any(
            f"(anonymous namespace)::{k}" in kernel for k in CUDA_KERNELS):
        return "moebench"
    if any(t in kernel for t in TORCH):
        return "torch"
    return "library"


def split(rows: list[dict]) -> dict:
    """{library_us, moebench_us, torch_us}: a phase's kernel time per call by owner (every kernel, not the kept
    rows)."""
    out = dict.fromkeys(OWNERS, 0.0)
    for r in rows:
        out[r.get("owner") or owner(r["kernel"])] += r["us_per_iter"]
    return {f"{k}_us": v for k, v in out.items()}


def profile(fn, timer: Timer, flushed: bool = False) -> KernelProfile:
    """Every kernel of the call (untruncated) and the GPU time they cover: calls back to back, or (flushed) each
    behind the timer's L2 flush as the api, cached and graph views time it."""
    lead = timer.lead if (flushed and timer.flushes) else None
    prof = kernel_profile(fn, timer.cuda, top=0, lead=lead)
    return prof._replace(rows=[{**r, "owner": owner(r["kernel"])} for r in prof.rows])


def host_split(median_us: float, prof: KernelProfile) -> dict:
    """Host time of a phase: what its api median holds beyond the GPU time its kernels cover (their sum where
    the overlap is unknown), beside their time by owner (split: the library's, moebench's, torch's). The kernels are profiled in calls of their own (a profiler inside the timed
    iterations would time itself too), so where they cover more than the median, the host time is within the
    noise of two samplings: host_us is then None and `host_note` says by how much, never a negative time."""
    ksum = sum(r["us_per_iter"] for r in prof.rows)
    busy = prof.busy_us if prof.busy_us is not None else ksum
    out = {"kernel_sum_us": ksum, "kernel_busy_us": prof.busy_us, **split(prof.rows), "host_us": median_us - busy}
    if out["host_us"] < 0:
        out["host_us"] = None
        out["host_note"] = (f"within noise: the kernels cover {busy:.1f} us in calls profiled apart, "
                            f"{busy - median_us:.1f} us ({(busy - median_us) / median_us:.1%}) above the api median")
    return out


def per_rank(timer: Timer, value: float, rank: int, *more: float) -> list[float]:
    """[rank 0's value, max over ranks, max over ranks of each of `more`], in one collective; every rank
    must call this."""
    return timer.agree_max([value if rank == 0 else 0.0, value, *more])
