"""timing.py: the one timer of dispatch and permute (CPU: host clock)."""
import time

import pytest
import torch

from moebench.harness import timing


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
    st = timing.stats([i * 1e-6 for i in range(1, 11)], "x")
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
