"""timing.py: the one timer of dispatch and permute (CPU: host clock)."""
import torch

from moebench import timing


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
