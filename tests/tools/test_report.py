"""moebench.report: tables, plots, --compare verdicts; a row that is the last of several runs says so,
--compare pools every run and names the functional-only records it left out."""
import json

import numpy as np
import pytest

from moebench import report
from moebench.records import plots


HW = {"hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16", "routing": "uniform", "seed": 0,
      "gpus_per_node": 8}


def rec(backend, T, phase, samples=None, median=None, hidden=7168, ep=8, busbw=None, ceiling=450.0,
        measured=370.0, knobs=None, status="PASS", p10=None, p90=None):
    w = dict(HW, num_tokens=T, hidden=hidden, ep=ep)
    if samples is not None:
        s = sorted(samples)
        median = float(np.median(s))
        timing = {"median_us": median, "p10_us": s[len(s) // 10], "p90_us": s[(9 * len(s)) // 10],
                  "min_us": s[0], "iters": len(s), "samples_us": list(samples)}
    else:
        timing = {"median_us": median, "p10_us": p10 if p10 is not None else median * 0.95,
                  "p90_us": p90 if p90 is not None else median * 1.05, "min_us": median * 0.9, "iters": 20}
    bus = T * 7.0 * 2 * hidden if ep > 1 else 0.0
    traffic = {"bytes": bus * 8 / 7, "bus_bytes": bus, "net_bytes": 0.0,
               "algbw_GBps": bus * 8 / 7 / (median * 1e3),
               "busbw_GBps": busbw if busbw is not None else bus / (median * 1e3),
               "ceiling_GBps": ceiling, "ceiling_source": "nominal NVLink (NVIDIA H200)",
               "measured_ceiling_GBps": measured}
    return {"schema": "moebench.result/1", "workload": w, "device": "cuda", "env": {"gpu": "NVIDIA H200"},
            "backend": {"name": backend, "knobs": knobs or {}}, "phase": phase, "timing": timing,
            "traffic": traffic, "check": {"status": status, "error": None}}


def noisy(center, n=40, seed=0, rel=0.02):
    return list(center * (1 + rel * np.random.default_rng(seed).standard_normal(n)))


def write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_plot_has_every_backend_and_both_ceilings(tmp_path):
    recs = []
    for T, (a, d) in {512: (100.0, 80.0), 2048: (300.0, 200.0), 8192: (1000.0, 700.0)}.items():
        for phase in ("dispatch", "combine"):
            recs += [rec("alltoall", T, phase, median=a), rec("deepep", T, phase, median=d)]
    png = tmp_path / "plot.png"
    fig = plots.plot_bandwidth(recs, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert len(fig.axes) == 2
    for ax in fig.axes:
        labels = [ln.get_label() for ln in ax.get_lines()]
        assert "alltoall" in labels and "deepep" in labels
        assert any(lb.startswith("nominal ceiling 450 GB/s") for lb in labels)
        assert any(lb.startswith("measured ceiling 370 GB/s") for lb in labels)
        line = next(ln for ln in ax.get_lines() if ln.get_label() == "deepep")
        assert list(line.get_xdata()) == [512, 2048, 8192]
        expect = [r["traffic"]["busbw_GBps"] for r in recs
                  if r["backend"]["name"] == "deepep" and r["phase"] == "dispatch"]
        if "dispatch" in ax.get_title():
            assert np.allclose(line.get_ydata(), expect)
        ceil = next(ln for ln in ax.get_lines() if ln.get_label().startswith("nominal"))
        assert np.allclose(ceil.get_ydata(), 450.0)
    assert {ax.get_title().split(":")[0] for ax in fig.axes} == {"dispatch", "combine"}


def test_plot_knob_settings_use_best_and_ep1_uses_algbw(tmp_path):
    recs = [rec("deepep", 1024, "dispatch", median=100.0, knobs={"num_sms": 8}),
            rec("deepep", 1024, "dispatch", median=50.0, knobs={"num_sms": 24})]
    ax = plots.plot_bandwidth(recs).axes[0]
    line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("deepep"))
    assert "best of 2 knob settings" in line.get_label()
    assert line.get_ydata()[0] == pytest.approx(recs[1]["traffic"]["busbw_GBps"])
    ep1 = [rec("alltoall", T, "dispatch", median=10.0, ep=1, measured=None) for T in (512, 1024)]
    ax = plots.plot_bandwidth(ep1).axes[0]
    assert "algbw" in ax.get_ylabel()
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "alltoall" in labels and not any(lb.startswith("measured") for lb in labels)


def test_compare_verdicts_on_known_differences(tmp_path):
    a, b = [], []
    cases = {512: 0.80, 2048: 1.25, 8192: 1.0}                  # B faster, slower, the same
    for i, (T, factor) in enumerate(cases.items()):
        a.append(rec("deepep", T, "dispatch", samples=noisy(100.0, seed=i)))
        b.append(rec("deepep", T, "dispatch", samples=noisy(100.0 * factor, seed=100 + i)))
    res = report.compare(a, b)
    got = {r["num_tokens"]: r for r in res["rows"]}
    assert got[512]["verdict"] == "faster" and got[2048]["verdict"] == "slower"
    assert got[8192]["verdict"] == "within noise"
    for T, factor in cases.items():
        r = got[T]
        assert r["noise"] == "bootstrap" and r["ci_low"] <= r["ratio"] <= r["ci_high"]
        assert abs(r["ratio"] - factor) < 0.05
        assert r["ci_high"] - r["ci_low"] < 0.1
    assert got[8192]["ci_low"] < 1.0 < got[8192]["ci_high"]
    # a 0.5% change with a tight band is real but below --min-effect
    tight_a = [rec("x", 512, "dispatch", samples=noisy(100.0, rel=0.0005))]
    tight_b = [rec("x", 512, "dispatch", samples=noisy(99.5, rel=0.0005, seed=1))]
    assert report.compare(tight_a, tight_b, min_effect=0.0)["rows"][0]["verdict"] == "faster"
    assert report.compare(tight_a, tight_b, min_effect=0.01)["rows"][0]["verdict"] == "within noise"


def test_compare_noise_band_grows_with_noise():
    a = [rec("deepep", 512, "dispatch", samples=noisy(100.0, rel=0.2, n=10))]
    b = [rec("deepep", 512, "dispatch", samples=noisy(92.0, rel=0.2, n=10, seed=5))]
    r = report.compare(a, b)["rows"][0]
    assert r["verdict"] == "within noise" and r["ci_high"] - r["ci_low"] > 0.15


def test_compare_falls_back_to_p10_p90_and_says_so(tmp_path, capsys):
    fa = write(tmp_path / "a.jsonl", [rec("alltoall", 512, "dispatch", median=100.0),
                                      rec("alltoall", 512, "combine", median=100.0)])
    fb = write(tmp_path / "b.jsonl", [rec("alltoall", 512, "dispatch", median=70.0),
                                      rec("alltoall", 512, "combine", median=101.0),
                                      rec("alltoall", 999, "combine", median=101.0)])
    assert report.main(["--compare", fa, fb]) == 0
    out = capsys.readouterr().out
    assert "p10/p90" in out and "NOTE" in out and "1 faster" in out and "1 within noise" in out
    assert "1 only in B" in out
    assert report.main(["--compare", fa, fb, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    verdicts = {r["phase"]: r["verdict"] for r in res["rows"]}
    assert verdicts == {"dispatch": "faster", "combine": "within noise"}
    assert all(r["noise"] == "p10/p90 approx" for r in res["rows"])


def test_compare_two_backends_in_one_file(tmp_path, capsys):
    recs = []
    for T in (512, 2048):
        recs += [rec("alltoall", T, "dispatch", samples=noisy(200.0, seed=T)),
                 rec("deepep", T, "dispatch", samples=noisy(120.0, seed=T + 1), knobs={"num_sms": 8}),
                 rec("deepep", T, "dispatch", samples=noisy(100.0, seed=T + 2), knobs={"num_sms": 24})]
    f = write(tmp_path / "r.jsonl", recs)
    assert report.main([f, "--compare", "alltoall", "deepep", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.count("| faster") == 2 and "num_sms=24" in out and "num_sms=8" not in out
    assert report.main([f, "--compare", "alltoall", "nope"]) == 2
    assert "neither a file nor a backend" in capsys.readouterr().err


def test_tables_grouped_by_shape_and_markdown(tmp_path, capsys):
    recs = [rec("deepep", 2048, "combine", median=90.0), rec("alltoall", 2048, "dispatch", median=50.0),
            rec("alltoall", 512, "dispatch", median=10.0), rec("alltoall", 512, "dispatch", median=11.0, hidden=2048),
            rec("hybridep", 512, "dispatch", median=10.0, status="FAIL")]
    f = write(tmp_path / "r.jsonl", recs)
    with open(f, "a") as fh:
        fh.write('{"cut short')
    assert report.main([f, "--markdown"]) == 0
    cap = capsys.readouterr()
    assert "skipped 1 malformed line: " in cap.err
    out = cap.out
    assert out.count("### ") == 2
    big = out[out.index("### H=7168"):]
    rows = [ln for ln in big.splitlines() if ln.startswith("| ") and "backend" not in ln]
    assert [r.split("|")[1].strip() for r in rows] == ["512", "512", "2048", "2048"]
    assert [r.split("|")[2].strip() for r in rows] == ["alltoall", "hybridep", "alltoall", "deepep"]
    assert "FAIL" in big
    assert report.main([f, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 5


def test_cli_plot_and_errors(tmp_path, capsys):
    f = write(tmp_path / "r.jsonl",
              [rec("alltoall", T, p, median=10.0) for T in (512, 1024) for p in ("dispatch", "combine")])
    png = tmp_path / "sub" / "p.png"
    assert report.main([f, "--plot", str(png)]) == 0 and png.is_file()
    assert report.main([str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    empty = write(tmp_path / "e.jsonl", [])
    assert report.main([empty]) == 2
    assert report.main([]) == 2


def test_a_plot_goes_to_exactly_the_path_named_or_is_refused_before_any_work(run_tool, tmp_path, monkeypatch):
    """--plot NAME without a suffix is a PNG named NAME (matplotlib alone writes NAME.png, and the tool said
    NAME); a suffix matplotlib writes no format for is refused before any work; a write that fails after the
    run is one line and exit 1 (issue 50)."""
    f = write(tmp_path / "r.jsonl", [rec("alltoall", T, "dispatch", median=10.0) for T in (512, 1024)])
    bare = tmp_path / "plot"
    p = run_tool("moebench.report", f, "--plot", str(bare))
    assert p.returncode == 0 and f"plot: {bare}" in p.stdout
    assert bare.read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "plot.png").exists()
    for flag in ("--plot", "--overlap-plot"):
        p = run_tool("moebench.report", f, flag, str(tmp_path / "p.xyz"))
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1
        assert p.stderr.startswith(f"moebench.report: error: {flag} ") and "writes no .xyz file" in p.stderr
        assert not (tmp_path / "p.xyz").exists()

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", full)
    p = run_tool("moebench.report", f, "--plot", str(tmp_path / "q.png"))
    assert p.returncode == 1 and p.stderr.splitlines() == [
        f"moebench.report: error: {tmp_path / 'q.png'}: the plot could not be written (No space left on device)"]


def test_tables_mark_the_last_of_repeated_runs(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    write(f, [rec("deepep", 1024, "dispatch", median=200.0), rec("deepep", 1024, "dispatch", median=100.0),
              rec("deepep", 2048, "dispatch", median=300.0)])
    assert report.main([str(f)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in ("1024", "2048")}
    assert " 100 " in rows["1024"] and "200" not in rows["1024"] and "[last of 2 runs]" in rows["1024"]
    assert "last of" not in rows["2048"]
    assert report.REPEATS_NOTE in out and "--compare pools" in out
    assert report.main([str(f), "--json"]) == 0
    assert all("_runs" not in r for r in json.loads(capsys.readouterr().out))


def test_a_setting_that_makes_another_case_is_its_own_row(tmp_path, capsys):
    """ncclep ht with and without zero copy, in one file: two rows (at 565af70 the second hid the first as
    its "last of 2 runs")."""
    f = tmp_path / "r.jsonl"
    write(f, [rec("ncclep", 4096, "combine", median=328.0, knobs={"mode": "ht", "zero_copy": 1}),
              rec("ncclep", 4096, "combine", median=635.0, knobs={"mode": "ht", "zero_copy": 0})])
    assert report.main([str(f)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("4096")]
    assert len(rows) == 2 and not any("last of" in r for r in rows)
    assert any("zero_copy=1" in r and " 328 " in r for r in rows)
    assert any("zero_copy=0" in r and " 635 " in r for r in rows)


def test_compare_says_it_pools_and_names_the_functional_records_left_out(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    cpu = dict(rec("deepep", 512, "dispatch", samples=noisy(50.0, seed=9)), device="cpu", functional=True)
    write(a, [rec("deepep", 1024, "dispatch", samples=noisy(100.0, seed=1)), cpu])
    write(b, [rec("deepep", 1024, "dispatch", samples=noisy(80.0, seed=2)),
              rec("deepep", 1024, "dispatch", samples=noisy(82.0, seed=3)), cpu])
    assert report.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    verdicts = [line for line in out.splitlines() if "faster" in line or "slower" in line or "within noise" in line]
    assert any(v.split()[0] == "1024" for v in verdicts) and not any(v.split()[0] == "512" for v in verdicts)
    assert "pools every run" in out
    assert "left out 2 record(s) that are functional only" in out
    assert report.main(["--compare", str(a), str(b), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["left_out_functional"] == 2 and len(res["rows"]) == 1


def test_compare_shows_the_footprint_difference_and_fits_160_columns(tmp_path, capsys):
    def with_memory(r, gib):
        return {**r, "memory": {"per_rank": [], "max": {"footprint_bytes": int(gib * 2**30)}}}
    f = write(tmp_path / "ab.jsonl", [with_memory(rec("alltoall", 4096, "dispatch", samples=noisy(100.0, seed=1)), 5.28),
                                      with_memory(rec("hybridep", 4096, "dispatch", samples=noisy(80.0, seed=2)), 4.08)])
    assert report.main(["--compare", "alltoall", "hybridep", f]) == 0
    out = capsys.readouterr().out
    assert "5.28->4.08 (-1.20)" in out and max(map(len, out.splitlines())) <= 160
    assert report.main(["--compare", "alltoall", "hybridep", f, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert (row["a_footprint_bytes"], row["b_footprint_bytes"]) == (int(5.28 * 2**30), int(4.08 * 2**30))
