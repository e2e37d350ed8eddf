"""Issue 13, first contact: figures with three significant digits, a legend, whole-word reasons."""
from moebench import report
from moebench.harness import sweep
from moebench.records import tables
from moebench.records.tables import shorten, sig3


def rec(**traffic):
    return {"backend": {"name": "alltoall"}, "phase": "dispatch", "workload": {}, "device": "cpu",
            "functional": True, "timing": {"median_us": 1234.5, "p90_us": 0.5},
            "traffic": {"algbw_GBps": 0.0213, "busbw_GBps": 0.0107, "wirebw_GBps": 0.0851, **traffic},
            "check": {"status": "PASS", "error": None}}


def test_sig3_keeps_three_significant_digits():
    assert [sig3(v) for v in (0.0213, 2.134, 12.0, 213.4, 2134.0, None)] == \
        ["0.0213", "2.13", "12.0", "213", "2130", "-"]


def test_dispatch_table_and_sweep_line_show_small_figures():
    row = tables.table_rows([rec(frac_of_ceiling=-0.00213)])[0]
    assert row[2:12] == ["1230", "0.500", "-", "-", "-", "-", "0.0213", "0.0107", "0.0851", "-0.00213"]
    line = sweep._summary_line(rec())
    assert "1230 us" in line and "0.0107 GB/s" in line


WAIVE = ("cannot take this run: hybridep needs (experts per rank x ranks per NVLink domain) % 4 == 0, got 1 x 2; "
         "HybridEPBuffer would refuse the configuration at construction")


def waived():
    return {"backend": {"name": "hybridep"}, "phase": "dispatch", "workload": {"num_tokens": 8}, "device": "cpu",
            "functional": True, "timing": None, "traffic": {}, "check": {"status": "WAIVED", "error": WAIVE}}


def test_dispatch_table_has_one_legend_line():
    text = tables.format_table([rec(), waived()])
    legend = [line for line in text.splitlines() if line.startswith("#")]
    assert len(legend) == 1
    for word in ("algbw", "busbw", "wirebw", "frac ceil", "'-'", "WAIVED", "EP 1"):
        assert word in legend[0], word


def test_reasons_are_cut_at_a_word_and_the_record_keeps_the_whole():
    words = set(WAIVE.replace("(", " ").replace(")", " ").split())
    r = waived()
    check = tables.table_rows([r])[0][-1]
    shown = check.split("(", 1)[1].rsplit("...)", 1)[0]
    assert len(shown) < len(WAIVE) and shown.split()[-1].strip("(,;:") in words, shown
    assert WAIVE.startswith(shown) and r["check"]["error"] == WAIVE
    cell = report._row(r)[-1]
    assert cell.endswith("...)") and cell[:-4].split()[-1].strip("(,;:") in words, cell
    assert shorten("x" * 200, 20) == "x" * 17 + "..." and shorten("short", 20) == "short"
