"""Timing: warm-up by a time budget, a barrier before every timed call (or, for local kernels,
the calls queued back to back), optional L2 flush, CUDA events around the call, every rank's times
gathered (the per-iteration max over ranks, then median / p10 / p90 / min, the tails and the rank
slowest most often: records/shapes.Tails). Also host time per call and Chrome traces.

Launch: after the barrier the L2 flush is queued first, so the host launches the call while the GPU
flushes, as a training step's host runs ahead of its GPU (DeepEP's bench and nvbench's cold runs
queue the launch behind a flush or a blocking kernel the same way). What the host does inside the
call after the GPU has caught up (waiting for split sizes, launching what follows the wait) stays in
t; ``host_us`` gives a call's whole host time. Without the flush the launch latency is in t. The
record says which (``timing.launch``).

On CPU (gloo) the same loop runs with a host clock: the numbers say the code works, not how fast.
"""
from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..records.shapes import Timing

L2_FLUSH_BYTES = 256 << 20


def agree_error(err: str, group) -> str:
    """The first rank's non-empty error, the same on every rank (so that all ranks skip what follows
    together, and none waits in a collective another rank will never join)."""
    if group is None or dist.get_world_size(group) == 1:
        return err
    errs = [None] * dist.get_world_size(group)
    dist.all_gather_object(errs, err, group=group)
    return next((f"{e}" for e in errs if e), "")


class Timer:
    """Times zero-argument callables the same way on every rank of `group`."""

    def __init__(self, device: torch.device, group=None, flush_l2: bool = True):
        self.device, self.group = device, group
        self.cuda = device.type == "cuda"
        self.flush_buf = (torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
                          if (self.cuda and flush_l2) else None)
        self._token = torch.zeros(1, device=device)

    @classmethod
    def for_run(cls, spec, device: torch.device, group) -> Timer:
        """The timer of a dispatch run: its settings read from the run's RunSpec (harness/spec.py)."""
        return cls(device, group, spec.flush_l2)

    def barrier(self) -> None:
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(self._token, group=self.group)
        if self.cuda:
            torch.cuda.synchronize(self.device)

    @property
    def flushes(self) -> bool:
        """Whether an L2 flush runs before each timed call (CUDA, unless --no-flush-l2)."""
        return self.flush_buf is not None

    def lead(self) -> None:
        """Queue the L2 flush (a read-only one: no dirty lines to write back while timed); the host
        goes on to launch the timed call while the GPU runs it."""
        if self.flushes:
            self.flush_buf.amax()

    @property
    def launch(self) -> str:
        if not self.cuda:
            return ""
        return ("behind the L2 flush (the host launches while the GPU flushes)" if self.flushes
                else "exposed (no L2 flush to queue behind)")

    def once(self, fn) -> float:
        """One timed call: barrier, the L2 flush queued (lead), CUDA events (CPU: host clock) around
        fn; seconds."""
        self.barrier()
        if self.cuda:
            self.lead()
        return self.alone(fn)

    def alone(self, fn) -> float:
        """One call timed as it is, after whatever is queued: CUDA events around it (CPU: host clock); seconds."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def agree_max(self, values: list[float]) -> list[float]:
        """Element-wise max over ranks (every rank gets the same list)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.cuda else "cpu")
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def across(self, values: list[float]) -> list[list[float]]:
        """Every rank's `values` in rank order, one all_gather (every rank gets all of them; every rank must give as
        many): the per-iteration max over ranks, the tails and the straggler (records/shapes.Tails) come from it."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.cuda else "cpu")
        if self.group is None or dist.get_world_size(self.group) == 1:
            return [t.tolist()]
        rows = [torch.empty_like(t) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(rows, t, group=self.group)
        return torch.stack(rows).cpu().tolist()

    def warmup(self, fn, budget_ms: float, max_calls: int = 1000) -> int:
        """At least two calls, then as many as fit the budget; every rank makes the same number."""
        first = self.agree_max([self.once(fn), self.once(fn)])
        per_call = max(first[1], 1e-6)
        n = int(self.agree_max([min(max_calls, budget_ms * 1e-3 / per_call)])[0])
        for _ in range(n):
            self.once(fn)
        return n + 2

    def queued(self, fn, iters: int) -> list[float]:
        """Seconds per call with the calls queued back to back and one wait at the end (one process,
        no barrier per call): each call's device time without the host's gaps between calls, as a
        kernel benchmark wants it. The L2 flush still runs before every call. CPU: host clock per call."""
        if not self.cuda:
            return [self.once(fn) for _ in range(iters)]
        self.barrier()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in ev:
            self.lead()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) * 1e-3 for s, e in ev]

    def run(self, fn, iters: int, warmup_ms: float, queued: bool = False, timed=None) -> Timing:
        """Warm up, then time `iters` calls: one at a time behind a barrier (the default: what a rank
        of a collective pays), or queued (`queued`: local kernels). timed: what the timed calls call instead of fn
        (an injected fault's wrapper, harness/fault.py)."""
        self.warmup(fn, warmup_ms)
        fn = timed or fn
        times = self.queued(fn, iters) if queued else [self.once(fn) for _ in range(iters)]
        ranks = self.across(times)
        st = Timing.of([max(col) for col in zip(*ranks)], self.timer_name, ranks)
        st.launch = "queued back to back" if (queued and self.cuda) else self.launch
        return st

    @property
    def timer_name(self) -> str:
        return "cuda-event" if self.cuda else "host-clock (CPU: functional only)"


def host_us(fn, cuda: bool, n: int = 10) -> float:
    """Median host time of one call in microseconds, the device idle before each call (launches
    plus any host wait inside fn)."""
    out = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def write_trace(timer: Timer, fn, path: str, n: int = 4) -> None:
    """Chrome trace (host calls and GPU kernels) of n queued, timed calls of fn."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timer.queued(fn, n)
    prof.export_chrome_trace(path)


FLUSH_RANGE = "moebench.l2_flush"     # the profiler range around a profiled call's L2 flush


class KernelProfile(NamedTuple):
    rows: list[dict]          # per kernel (CUDA) or top-level torch op (CPU): calls and us per call, largest first
    busy_us: float | None     # CUDA: GPU time per call that the kernels cover, the union of their intervals: their
                              # sum where they run one after another, less where they overlap (programmatic
                              # dependent launches); None on CPU or where the flush's kernels cannot be told apart


def kernel_profile(fn, cuda: bool, n: int = 5, top: int = 8, lead=None) -> KernelProfile:
    """The op's own pieces, under torch.profiler: per GPU kernel (CUDA) or per top-level torch op
    (CPU), calls and microseconds per call of fn, largest first (the `top` largest; 0: all), and the GPU
    time they cover. fn runs once more untimed before the n profiled calls; on several ranks every rank must
    call this (fn may hold collectives). `lead` (CUDA; Timer.lead, the L2 flush) runs before every profiled
    call, as the api and cached views run it, and its kernels are left out."""
    from torch.profiler import ProfilerActivity, profile, record_function
    fn()
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CUDA] + [ProfilerActivity.CPU] * (lead is not None or not cuda)
    with profile(activities=acts) as prof:
        for _ in range(n):
            if lead is not None:
                with record_function(FLUSH_RANGE):
                    lead()
            fn()
        if cuda:
            torch.cuda.synchronize()
    busy = None
    if not cuda:
        rows = [{"kernel": ev.key[:80], "calls_per_iter": ev.count / n, "us_per_iter": ev.self_cpu_time_total / n}
                for ev in prof.key_averages() if ev.self_cpu_time_total and ev.count]
    else:
        events = prof.events()
        rows, busy = _device_rows(events, n), _busy_us(events, n)
    rows.sort(key=lambda r: -r["us_per_iter"])
    return KernelProfile(rows[:top] if top else rows, busy)


def _kernels(events) -> list:
    """The profile's GPU kernels: device events less the ranges' own device-side spans (kineto's
    gpu_user_annotation, named like the range; torch 2.11 has no activity_type, so the range names come from
    the host side too)."""
    cpu = torch.autograd.DeviceType.CPU
    ranges = {FLUSH_RANGE} | {ev.name for ev in events if ev.device_type == cpu and getattr(ev, "is_user_annotation", False)}
    return [ev for ev in events if ev.device_type != cpu and not ev.is_async and ev.name not in ranges
            and "annotation" not in (getattr(ev, "activity_type", None) or "")]


def _device_rows(events, n: int) -> list[dict]:
    """Per kernel name: calls and device us per call, less the kernels launched inside FLUSH_RANGE: those inside
    its device-side span where the profile has one (kernels launched by no torch op, e.g. a sleep kernel or an
    extension's barrier, are found only so), else those of the torch ops under it."""
    cpu = torch.autograd.DeviceType.CPU
    spans = _flush_spans(events)
    calls, us = {}, {}
    for ev in _kernels(events):
        if any(s <= ev.time_range.start and ev.time_range.end <= e for s, e in spans):
            continue
        calls[ev.name] = calls.get(ev.name, 0) + 1
        us[ev.name] = us.get(ev.name, 0.0) + ev.time_range.elapsed_us()
    todo = [] if spans else [ev for ev in events if ev.name == FLUSH_RANGE and ev.device_type == cpu]
    while todo:                                   # the flush range and every op under it
        ev = todo.pop()
        todo += ev.cpu_children
        for k in ev.kernels:
            calls[k.name] -= 1
            us[k.name] -= k.duration
    return [{"kernel": name[:80], "calls_per_iter": calls[name] / n, "us_per_iter": us[name] / n}
            for name in us if calls[name] > 0 and us[name] > 0]


def _flush_spans(events) -> list[tuple[float, float]]:
    """The device-side spans of FLUSH_RANGE (kineto's gpu_user_annotation: from the first to the last kernel
    launched inside it)."""
    return [(ev.time_range.start, ev.time_range.end) for ev in events
            if ev.name == FLUSH_RANGE and ev.device_type != torch.autograd.DeviceType.CPU]


def _busy_us(events, n: int) -> float | None:
    """GPU us per call covered by the call's kernels (the union of their intervals), the flush's kernels (those
    inside the flush range's device-side span) left out; None where a flush ran but no such span was recorded."""
    spans = _flush_spans(events)
    if not spans and any(ev.name == FLUSH_RANGE for ev in events):
        return None
    ivs = sorted((ev.time_range.start, ev.time_range.end) for ev in _kernels(events)
                 if not any(s <= ev.time_range.start and ev.time_range.end <= e for s, e in spans))
    busy, end = 0.0, float("-inf")
    for a, b in ivs:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return busy / n


def measure_alltoall(timer, group, device, bytes_per_rank: int, iters: int = 20, warmup_ms: float = 50):
    """busbw of a plain all_to_all_single moving `bytes_per_rank` out of each rank in equal splits.

    Returns (median seconds, busbw GB/s counting the (W-1)/W of bytes that leave the rank), or
    None with one rank (nothing crosses a link).
    """
    world = dist.get_world_size(group)
    if world < 2:
        return None
    n = max(world, bytes_per_rank // 2 // world * world)
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    st = timer.run(lambda: dist.all_to_all_single(dst, src, group=group), iters, warmup_ms)
    seconds = st.median_us * 1e-6
    return seconds, n * 2 * (world - 1) / world / seconds * 1e-9
