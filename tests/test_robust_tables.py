"""Issue 13, first contact: figures with three significant digits, a legend, whole-word reasons."""
from moebench import results, sweep
from moebench.cli import sig3


def rec(**traffic):
    return {"backend": {"name": "alltoall"}, "phase": "dispatch", "workload": {}, "device": "cpu",
            "functional": True, "timing": {"median_us": 1234.5, "p90_us": 0.5},
            "traffic": {"algbw_GBps": 0.0213, "busbw_GBps": 0.0107, "wirebw_GBps": 0.0851, **traffic},
            "check": {"status": "PASS", "error": None}}


def test_sig3_keeps_three_significant_digits():
    assert [sig3(v) for v in (0.0213, 2.134, 12.0, 213.4, 2134.0, None)] == \
        ["0.0213", "2.13", "12.0", "213", "2130", "-"]


def test_dispatch_table_and_sweep_line_show_small_figures():
    row = results.table_rows([rec(frac_of_ceiling=-0.00213)])[0]
    assert row[2:10] == ["1230", "0.500", "-", "-", "0.0213", "0.0107", "0.0851", "-0.00213"]
    line = sweep._summary_line(rec())
    assert "1230 us" in line and "0.0107 GB/s" in line
