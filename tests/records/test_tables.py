"""The terminal tables: figures with three significant digits, one legend line, whole-word reasons, a
table that fits 160 columns."""
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
    row = tables.table_rows([rec(frac_of_ceiling=-0.00213)])[0]           # SMs, api, lib, graph (p90, api-graph: --wide)
    assert row[2:9] == ["-", "1230", "-", "-", "0.0213", "0.0107", "-0.00213"]
    wide = tables.table_rows([rec(frac_of_ceiling=-0.00213)], ("api", "cached", "kernel", "graph"), wide=True)[0]
    # api, lib, p90, p99 (--wide), cached, kernel, graph, api-graph, ...
    assert wide[3:15] == ["1230", "-", "0.500", "-", "-", "-", "-", "-", "0.0213", "0.0107", "0.0851", "-0.00213"]
    lib = {**rec(), "timing": {"median_us": 1234.5, "p90_us": 0.5, "library_us": 321.0}}
    assert tables.table_rows([lib])[0][3:5] == ["1230", "321"]           # the library's share beside the api figure


def test_the_table_names_each_backends_sms_and_mode():
    """SMs from the record's knobs (num_sms_used): a count, NCCL's own choice, or '-' where an older record has none."""
    ncclep = {**rec(), "backend": {"name": "ncclep", "knobs": {"mode": "ll", "num_sms_used": 132}}}
    a2a = {**rec(), "backend": {"name": "alltoall", "knobs": {"num_sms_used": "nccl"}}}
    rows = tables.table_rows([ncclep, a2a, rec()])
    assert [r[:3] for r in rows] == [["ncclep ll", "dispatch", "132"], ["alltoall", "dispatch", "nccl"],
                                     ["alltoall", "dispatch", "-"]]
    assert tables.columns(("api", "graph"), False, False)[:4] == ["backend", "phase", "SMs", "api us"]
    line = sweep._summary_line(rec())
    assert "1230 us" in line and "0.0107 GB/s" in line


WAIVE = ("cannot take this run: hybridep needs (experts per rank x ranks per NVLink domain) % 4 == 0, got 1 x 2; "
         "HybridEPBuffer would refuse the configuration at construction")


def waived():
    return {"backend": {"name": "hybridep"}, "phase": "dispatch", "workload": {"num_tokens": 8}, "device": "cpu",
            "functional": True, "timing": None, "traffic": {}, "check": {"status": "WAIVED", "error": WAIVE}}


def test_dispatch_table_has_one_legend_line_and_waived_backends_on_one_line_each():
    fail = {**rec(), "backend": {"name": "deepep"}, "check": {"status": "FAIL", "error": WAIVE}}
    text = tables.format_table([rec(), fail, {**fail, "phase": "combine"}, waived(), {**waived(), "phase": "combine"}])
    lines = text.splitlines()
    assert [ln for ln in lines if ln.startswith("# WAIVED")] == [f"# WAIVED hybridep: {tables.shorten(WAIVE, 142)}"]
    assert [ln for ln in lines if ln.startswith("# FAIL")] == [f"# FAIL deepep: {tables.shorten(WAIVE, 140)}"]
    assert not any(ln.startswith("hybridep") for ln in lines)          # no rows of dashes for what did not run
    assert [ln.split()[-2:] for ln in lines if ln.startswith("deepep")] == [["FAIL", "[functional]"]] * 2
    legend = [ln for ln in lines if ln.startswith("#") and not ln.startswith(("# WAIVED", "# FAIL"))]
    assert len(legend) == 1 and max(len(ln) for ln in lines) <= 160     # one legend line; everything fits 160
    for word in ("algbw", "busbw", "frac ceil", "README.md"):
        assert word in legend[0], word


def test_long_note_lines_wrap_at_words_and_table_lines_stay():
    note = "# " + " ".join(f"--flag-{i} value" for i in range(30))
    row = "x" * 200
    out = tables.fit([note, row, "# short"])
    assert out[-2:] == [row, "# short"] and all(len(ln) <= 160 for ln in out[:-2])
    assert out[1].startswith("#   ") and " ".join(ln.removeprefix("#   ") for ln in out[:-2]) == note


def test_reasons_are_cut_at_a_word_and_the_record_keeps_the_whole():
    words = set(WAIVE.replace("(", " ").replace(")", " ").split())
    r = {**waived(), "check": {"status": "FAIL", "error": WAIVE}}
    check = tables.table_rows([r], wide=True)[0][-1]
    shown = check.split("(", 1)[1].rsplit("...)", 1)[0]
    assert tables.table_rows([r])[0][-1] == "FAIL"         # the default table: why on a line below
    assert len(shown) < len(WAIVE) and shown.split()[-1].strip("(,;:") in words, shown
    assert WAIVE.startswith(shown) and r["check"]["error"] == WAIVE
    cell = report._row(r)[-1]
    assert cell.endswith("...)") and cell[:-4].split()[-1].strip("(,;:") in words, cell
    assert shorten("x" * 200, 20) == "x" * 17 + "..." and shorten("short", 20) == "short"
