"""Overlap mode: a phase under a concurrent GEMM (CPU: sequential, functional), the record's
figures, the table columns, the plot, and `megatron flags --overlap` deciding from the figures."""
import json

import pytest

from moebench.core.workload import WorkloadError
from moebench.dispatch import main
from moebench.harness import overlap
from moebench.megatron import ab
from moebench.records.plots import overlap_series
from moebench.report import main as report_main

SHAPE = ["--ep", "2", "--num-tokens", "16", "--hidden", "64", "--num-experts", "8", "--topk", "2", "--iters", "3"]


def test_overlap_spec_parses_and_rejects():
    assert overlap.parse(None) is None and overlap.parse("gemm") == "auto"
    assert overlap.parse("gemm:128x256x64") == (128, 256, 64)
    assert overlap.gemm_shape("auto", 40, 64) == (40, 64, 64)
    for bad in ("gemm:0x1x1", "gemm:1x2", "matmul", "gemm:axbxc"):
        with pytest.raises(WorkloadError, match="--overlap"):
            overlap.parse(bad)


def test_bad_overlap_flag_is_one_line_exit_2(capsys):
    assert main(SHAPE + ["--backend", "alltoall", "--overlap", "gemm:1x2"]) == 2
    assert "--overlap" in capsys.readouterr().err


def test_cpu_overlap_run_records_the_figures(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    assert main(SHAPE + ["--backend", "alltoall", "--overlap", "gemm:64x64x64", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "exposed us" in table and "GEMM slowdown" in table
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["phase"] for r in recs} == {"dispatch", "combine"}
    for r in recs:
        o = r["overlap"]
        assert set(overlap.FIELDS) <= o.keys() and o["gemm"].startswith("64x64x64")
        assert o["comm_alone_us"] == r["timing"]["median_us"]
        assert o["exposed_us"] == pytest.approx(o["overlapped_us"] - o["gemm_alone_us"])
        assert o["overlapped_us"] >= o["gemm_overlapped_us"] > 0
    png = tmp_path / "o.png"
    assert report_main([str(out), "--overlap-plot", str(png)]) == 0 and png.stat().st_size > 1000


def rec(name, phase, comm, exposed, gemm=1000.0, spread=5.0, sms=None, functional=False):
    o = {"gemm": "x", "comm_alone_us": comm, "gemm_alone_us": gemm, "overlapped_us": gemm + exposed,
         "overlapped_p10_us": gemm + exposed - spread, "overlapped_p90_us": gemm + exposed + spread,
         "gemm_alone_p90_us": gemm + spread, "gemm_overlapped_us": gemm + exposed, "exposed_us": exposed,
         "gemm_slowdown": (gemm + exposed) / gemm}
    t = {"median_us": comm, "p10_us": comm - 1, "p90_us": comm + 1}
    return {"workload": {"num_tokens": 4096, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8},
            "device": "cuda", "backend": {"name": name, "knobs": {"num_sms": sms} if sms else {}}, "phase": phase,
            "timing": t, "check": {"status": "PASS"}, "overlap": o, "functional": functional}


def test_overlap_decision_hides_more_than_the_noise():
    recs = [rec("alltoall", "dispatch", 300, 40), rec("alltoall", "combine", 250, 30)]
    v = ab.overlap_pays(recs, "alltoall")
    assert v["on"] and v["hidden_us"] == pytest.approx(480) and "hides 480.0 us" in v["why"]


def test_overlap_decision_off_when_the_slowdown_eats_the_gain_or_within_noise():
    eaten = ab.overlap_pays([rec("alltoall", "dispatch", 300, 320), rec("alltoall", "combine", 250, 260)], "alltoall")
    assert not eaten["on"] and "eats the gain" in eaten["why"]
    noisy = ab.overlap_pays([rec("alltoall", "dispatch", 300, 295, spread=20),
                            rec("alltoall", "combine", 250, 245, spread=20)], "alltoall")
    assert not noisy["on"] and "within the noise" in noisy["why"]
    missing = ab.overlap_pays([rec("alltoall", "dispatch", 300, 40)], "alltoall")
    assert not missing["on"] and "--overlap gemm" in missing["why"]


def test_megatron_flags_emit_overlap_only_when_measured_to_pay():
    pays = [rec("alltoall", "dispatch", 300, 40), rec("alltoall", "combine", 250, 30)]
    d = ab.decisions_from_results(pays, "0.16.1", overlap=True)[0]
    assert "--overlap-moe-expert-parallel-comm" in d["flags"]["megatron_lm"]
    assert d["flags"]["notes"][0].startswith("overlap on: ") and d["overlap"]["on"]
    eaten = [rec("alltoall", "dispatch", 300, 320), rec("alltoall", "combine", 250, 260)]
    d = ab.decisions_from_results(eaten, "0.16.1", overlap=True)[0]
    assert "--overlap-moe-expert-parallel-comm" not in d["flags"]["megatron_lm"]
    assert d["flags"]["notes"][0].startswith("overlap not emitted: the GEMM's slowdown")


def test_overlap_plot_series_follow_the_sm_knob():
    recs = [rec("deepep", "dispatch", 300, e, sms=s) for s, e in ((24, 50), (8, 20), (16, 30))]
    lines, functional = overlap_series(recs)
    assert lines[("deepep", "dispatch")] == [(8, 20, 1.02), (16, 30, 1.03), (24, 50, 1.05)] and not functional
    lines, functional = overlap_series([rec("alltoall", "dispatch", 300, 20, functional=True)])
    assert functional and lines[("alltoall", "dispatch")][0][0] == 0
