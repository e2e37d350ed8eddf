"""Overlap mode (`--overlap gemm[:MxNxK]`): a phase under a concurrent expert GEMM.

Megatron's EP overlap hides dispatch/combine behind the experts' GEMMs, but the communication
kernels take SMs and memory bandwidth from the GEMM they hide behind. Per iteration, after the
usual barrier, the GEMM is queued on a side stream and the phase runs on the current stream,
launched together; CUDA events on both streams give
  overlapped  from the start to the later of the two ends,
  gemm        the GEMM's own time while the phase runs beside it,
each the per-iteration max over ranks, medians over iterations. With the phase alone (the `api`
view) and the GEMM alone, timed the same way:
  exposed_us    = overlapped_us - gemm_alone_us   (what overlap leaves on the critical path)
  gemm_slowdown = gemm time overlapped / gemm_alone_us
The GEMM stands for the local experts' grouped GEMM of the received rows: by default one bf16
[M, K] x [K, N] matmul with M = the rows this rank's checked dispatch received, K = N = hidden;
`gemm:MxNxK` sets the shape. On CPU (gloo) there are no streams: the GEMM runs before the
phase in each iteration, so the figures are functional only, like every CPU figure.
"""
from __future__ import annotations

import re
import statistics
import time

import torch

from ..core.workload import WorkloadError
from ..records.shapes import Overlap, Timing
from .timing import Timer

FIELDS = ("comm_alone_us", "gemm_alone_us", "overlapped_us", "exposed_us", "gemm_slowdown")


def parse(spec: str | None) -> tuple[int, int, int] | None | str:
    """'gemm' -> 'auto'; 'gemm:MxNxK' -> (M, N, K); None -> None. WorkloadError otherwise."""
    if spec is None:
        return None
    if spec == "gemm":
        return "auto"
    m = re.fullmatch(r"gemm:(\d+)x(\d+)x(\d+)", spec)
    if not m or min(map(int, m.groups())) < 1:
        raise WorkloadError(f"--overlap wants gemm or gemm:MxNxK with positive sizes, got {spec!r}")
    return tuple(int(g) for g in m.groups())


def gemm_shape(spec, received_rows: int, hidden: int) -> tuple[int, int, int]:
    """(M, N, K) of the GEMM: the spec's, or the received rows x hidden x hidden."""
    return spec if isinstance(spec, tuple) else (max(1, received_rows), hidden, hidden)


class Gemm:
    """One bf16 (CUDA) or fp32 (CPU) matmul of the given shape into a preallocated output."""

    def __init__(self, shape: tuple[int, int, int], device: torch.device):
        M, N, K = shape
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32
        g = torch.Generator(device="cpu").manual_seed(0)
        self.a = torch.randn(M, K, generator=g).to(device, dt)
        self.b = torch.randn(K, N, generator=g).to(device, dt)
        self.out = torch.empty(M, N, device=device, dtype=dt)
        self.shape = shape

    def __call__(self) -> None:
        torch.matmul(self.a, self.b, out=self.out)


def _once_cuda(timer: Timer, fn, gemm: Gemm, side: torch.cuda.Stream) -> tuple[float, float]:
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    main = torch.cuda.current_stream()
    timer.barrier()
    timer.lead()                     # the same L2 flush, queued the same way, as the phase alone
    ev[0].record(main)
    side.wait_event(ev[0])
    with torch.cuda.stream(side):
        gemm()                       # queued first: the phase's host waits cannot delay it
        ev[1].record(side)
    fn()
    ev[2].record(main)
    main.wait_stream(side)
    torch.cuda.synchronize(timer.device)
    gemm_s = ev[0].elapsed_time(ev[1]) * 1e-3
    return max(gemm_s, ev[0].elapsed_time(ev[2]) * 1e-3), gemm_s


def _once_cpu(timer: Timer, fn, gemm: Gemm) -> tuple[float, float]:
    timer.barrier()
    t0 = time.perf_counter()
    gemm()
    t1 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, t1 - t0


def measure(timer: Timer, fn, gemm: Gemm, comm_alone_us: float, iters: int, warmup_ms: float) -> dict:
    """The overlap figures of one phase (every rank calls this; the phase alone is already timed).
    The GEMM alone and the overlapped pair alternate, iteration by iteration, and the GEMM alone
    runs on the same side stream, so clock drift and stream placement hit both alike."""
    side = torch.cuda.Stream(device=timer.device) if timer.cuda else None

    def alone() -> float:
        if side is None:
            return timer.once(gemm)
        with torch.cuda.stream(side):
            return timer.once(gemm)

    once = (lambda: _once_cuda(timer, fn, gemm, side)) if timer.cuda else (lambda: _once_cpu(timer, fn, gemm))
    timer.warmup(gemm, warmup_ms)
    for _ in range(2):
        once()
    rows = [(alone(), *once()) for _ in range(iters)]
    flat = timer.agree_max([v for row in rows for v in row])
    g_alone = Timing.of(flat[0::3], timer.timer_name)
    over = Timing.of(flat[1::3], timer.timer_name)
    g_over = statistics.median(flat[2::3]) * 1e6
    return Overlap(gemm="x".join(map(str, gemm.shape)) + (" bf16" if timer.cuda else " fp32, sequential (CPU)"),
                   comm_alone_us=comm_alone_us, gemm_alone_us=g_alone.median_us, gemm_alone_p90_us=g_alone.p90_us,
                   overlapped_us=over.median_us, overlapped_p10_us=over.p10_us, overlapped_p90_us=over.p90_us,
                   gemm_overlapped_us=g_over, exposed_us=over.median_us - g_alone.median_us,
                   gemm_slowdown=g_over / g_alone.median_us).asdict()
