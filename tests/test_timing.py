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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_launch_hides_behind_the_flush_only_when_there_is_one():
    """A call that spends 30 us on the host before its one small kernel: behind the L2 flush (~60 us
    on an H100/H200) the host time is hidden; with no flush it is inside t."""
    x = torch.zeros(1, device="cuda")

    def fn():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 30e-6:
            pass
        x.add_(1)
    dev = torch.device("cuda")
    hidden = timing.Timer(dev).run(fn, iters=20, warmup_ms=5.0)
    exposed = timing.Timer(dev, flush_l2=False).run(fn, iters=20, warmup_ms=5.0)
    assert hidden.launch.startswith("behind") and exposed.launch.startswith("exposed")
    assert exposed.median_us >= 30 and hidden.median_us < 20
