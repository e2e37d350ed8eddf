"""timing.py: the one timer of dispatch and permute (CPU: host clock)."""
import time

import pytest
import torch

from moebench.harness import timing
from moebench.records.shapes import Timing


def test_run_counts_calls_and_labels_the_clock():
    calls = []
    t = timing.Timer(torch.device("cpu"))
    for queued in (False, True):
        calls.clear()
        st = t.run(lambda: calls.append(1), iters=4, warmup_ms=0.0, queued=queued)
        assert len(calls) == 2 + 4                      # two warm-up calls at a zero budget, then 4 timed
        assert st.iters == 4 and len(st.samples_us) == 4 and st.timer.startswith("host-clock")
        assert st.min_us <= st.p10_us <= st.median_us <= st.p90_us


def test_stats_percentile_rule():
    st = Timing.of([i * 1e-6 for i in range(1, 11)], "x")
    assert (st.p10_us, st.median_us, st.p90_us, st.min_us) == (1.0, 5.5, 9.0, 1.0)


def test_host_us_is_a_median_of_n_calls():
    calls = []
    assert timing.host_us(lambda: calls.append(1), cuda=False, n=7) >= 0 and len(calls) == 7


def test_cpu_stats_name_no_launch():
    st = timing.Timer(torch.device("cpu")).run(lambda: None, iters=2, warmup_ms=0.0)
    assert "launch" not in st.asdict()


def _flush_cover_us(timer) -> tuple[float, float]:
    """(device us of the L2 flush, host us of queuing it), medians of 5: what the flush leaves for the
    host to launch the timed call in is their difference."""
    dev, host = [], []
    for _ in range(5):
        timer.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        timer.lead()
        host.append((time.perf_counter() - t0) * 1e6)
        end.record()
        end.synchronize()
        dev.append(start.elapsed_time(end) * 1e3)
    return sorted(dev)[2], sorted(host)[2]


@pytest.mark.gpu
@pytest.mark.alone
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_launch_hides_behind_the_flush_only_when_there_is_one():
    """A call that spends host time before its one small kernel: behind the L2 flush that host time is
    hidden (up to what the flush leaves over its own launch: a fixed 30 us was more than that on the H200);
    with no flush it is inside t."""
    x = torch.zeros(1, device="cuda")
    dev = torch.device("cuda")
    flush_us, queue_us = _flush_cover_us(timing.Timer(dev))
    cover = flush_us - queue_us
    assert cover >= 10, (flush_us, queue_us)          # the flush leaves the host room to launch a call
    spin = cover / 2

    def fn():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < spin * 1e-6:
            pass
        x.add_(1)
    hidden = timing.Timer(dev).run(fn, iters=20, warmup_ms=5.0)
    exposed = timing.Timer(dev, flush_l2=False).run(fn, iters=20, warmup_ms=5.0)
    assert hidden.launch.startswith("behind") and exposed.launch.startswith("exposed")
    facts = (flush_us, queue_us, spin, hidden.median_us, exposed.median_us)
    assert exposed.median_us >= spin and hidden.median_us <= exposed.median_us - spin / 2, facts


class _Ev:
    """A torch.profiler FunctionEvent as _device_rows reads it."""
    def __init__(self, name, device=False, us=0.0, kernels=(), children=(), activity=None, start=0.0):
        self.name, self.is_async, self.kernels, self.cpu_children = name, False, list(kernels), list(children)
        if activity:              # torch 2.13 names the activity; 2.11 FunctionEvents have no such field
            self.activity_type = activity
        self.device_type = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
        self.time_range = type("R", (), {"elapsed_us": lambda _self: us, "start": start, "end": start + us})()


def flushed_calls(spin: bool = False):
    """Two profiled calls, each behind a flush whose reduce kernel the call itself also launches once (and, with
    spin, a sleep kernel no torch op launched, as bench_kineto's lead does), the flush's kernels inside the
    range's GPU span, the call's after it."""
    from collections import namedtuple
    K = namedtuple("K", "name device duration")
    events = []
    for t0 in (0.0, 1000.0):
        amax = _Ev("aten::amax", kernels=[K("reduce", 0, 90.0)])
        events += [_Ev(timing.FLUSH_RANGE, children=[amax]), amax, _Ev("reduce", True, 90.0, start=t0),
                   *([_Ev("spin_kernel", True, 300.0, start=t0 + 91)] if spin else []),
                   _Ev(timing.FLUSH_RANGE, True, 400.0 if spin else 91.0, start=t0),   # the range's GPU span
                   _Ev("user.range", True, 7.0, activity="gpu_user_annotation", start=t0 + 500),  # newer torch's
                   _Ev("copy", True, 10.0, start=t0 + 500), _Ev("reduce", True, 4.0, start=t0 + 510)]
    return events


@pytest.mark.parametrize("spin", [False, True])
def test_device_rows_leave_out_the_kernels_under_the_flush_range(spin):
    """The rows keep the call's kernels (its own reduce included) and drop exactly the flush's (a kernel no op
    launched too: found by the range's GPU span), and the range's GPU span itself."""
    events = flushed_calls(spin)
    rows = {r["kernel"]: r for r in timing._device_rows(events, 2)}
    assert rows["copy"] == {"kernel": "copy", "calls_per_iter": 1.0, "us_per_iter": 10.0}
    assert rows["reduce"]["calls_per_iter"] == 1.0 and rows["reduce"]["us_per_iter"] == pytest.approx(4.0)
    assert set(rows) == {"copy", "reduce"}
    no_flush = timing._device_rows([e for e in events if e.name not in (timing.FLUSH_RANGE, "aten::amax")], 2)
    assert {r["kernel"]: r["calls_per_iter"] for r in no_flush} == {"copy": 1.0, "reduce": 2.0,
                                                                     **({"spin_kernel": 1.0} if spin else {})}
    # a profile without the range's GPU span (older torch): the kernels of the torch ops under the range
    cpu = torch.autograd.DeviceType.CPU
    host_only = [e for e in events if not (e.name == timing.FLUSH_RANGE and e.device_type != cpu)]
    rows = {r["kernel"]: r for r in timing._device_rows(host_only, 2)}
    assert rows["reduce"]["calls_per_iter"] == 1.0 and rows["copy"]["calls_per_iter"] == 1.0


def test_busy_time_is_the_union_of_the_calls_kernels_without_the_flush():
    """Two calls, each a flush (its kernel inside the range's device span) then an index kernel that a
    dependent copy overlaps by 3 us: the busy time is what the call's kernels cover, not their sum."""
    events = []
    for t0 in (0.0, 1000.0):
        events += [_Ev(timing.FLUSH_RANGE), _Ev(timing.FLUSH_RANGE, True, 95.0, start=t0),
                   _Ev("flush_reduce", True, 90.0, start=t0 + 2),
                   _Ev("route", True, 5.0, start=t0 + 100), _Ev("copy", True, 20.0, start=t0 + 102)]
    assert timing._busy_us(events, 2) == pytest.approx(22.0)          # 100..122, against a sum of 25
    assert sum(r["us_per_iter"] for r in timing._device_rows(events, 2) if r["kernel"] != "flush_reduce") == 25.0
    no_flush = [e for e in events if e.name not in (timing.FLUSH_RANGE, "flush_reduce")]
    assert timing._busy_us(no_flush, 2) == pytest.approx(22.0)
    # a flush ran but its device span is missing: the flush's kernels cannot be told apart
    no_span = [e for e in events if not (e.name == timing.FLUSH_RANGE and e.device_type != torch.autograd.DeviceType.CPU)]
    assert timing._busy_us(no_span, 2) is None


@pytest.mark.gpu
@pytest.mark.alone
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flushed_profile_is_the_call_alone_on_a_cold_l2():
    """kernel_profile with lead: the call's kernel once per call, none of the flush's, and slower than back to
    back when its 16 MiB fit in L2 (the flush evicts them, as the api, cached and graph views do)."""
    x = torch.ones(4 << 20, device="cuda")
    timer = timing.Timer(torch.device("cuda"))
    fn = lambda: x.mul_(1.0)  # noqa: E731
    flush = {r["kernel"] for r in timing.kernel_profile(timer.lead, True, top=0).rows}
    warm, _ = timing.kernel_profile(fn, True, top=0)
    cold, busy = timing.kernel_profile(fn, True, top=0, lead=timer.lead)
    assert [r["kernel"] for r in cold] == [r["kernel"] for r in warm] and not flush & {r["kernel"] for r in cold}
    assert all(r["calls_per_iter"] == 1.0 for r in cold), cold
    assert cold[0]["us_per_iter"] > warm[0]["us_per_iter"], (cold, warm)
    assert busy == pytest.approx(cold[0]["us_per_iter"], rel=0.01), (busy, cold)     # one kernel, no flush in it
