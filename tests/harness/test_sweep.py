"""Sweeps: named sweep files, resume after interruption, knob sweeps, the time left by the work of the
cases still to run (tokens x hidden x top-k), not their count."""
import json
import os

import pytest

from moebench import dispatch
from moebench.core.workload import Workload
from moebench.core.workload import WorkloadError
from moebench.harness import eta, sweep
from moebench.records import knobs


TINY = """
description = "tiny CPU sweep"
hidden = 64
num_experts = 8
topk = 2
num_tokens = [16, 32, 48]
"""


def test_named_sweeps_have_the_issue_shapes():
    want = {"dsv3": (7168, 256, 8), "qwen3-30b-a3b": (2048, 128, 8), "qwen3-235b": (4096, 128, 8),
            "mixtral": (4096, 8, 2)}
    for name, (h, e, k) in want.items():
        s = sweep.load(name)
        assert (s.axes["hidden"], s.axes["num_experts"], s.axes["topk"]) == ([h], [e], [k])
        wls = sweep.workloads(s, {"ep": 8})
        assert [w.num_tokens for w in wls] == sorted(w.num_tokens for w in wls)
        for backend in ("deepep", "hybridep"):
            sms = s.knobs[backend]["num_sms"]
            assert min(sms) == 8 and max(sms) == 48 and all(n % 2 == 0 for n in sms)
    tokens = [w.num_tokens for w in sweep.workloads(sweep.load("dsv3"), {"ep": 8})]
    assert tokens[0] == 512 and tokens[-1] == 16384


def test_bad_sweep_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("hidden = 64\nnum_experts = 8\ntopk = 2\nnum_tokens = [16]\ncolour = 'red'\n")
    with pytest.raises(WorkloadError, match="unknown keys"):
        sweep.load(str(bad))
    bad.write_text("hidden = 64\ntopk = 2\nnum_tokens = [16]\n")
    with pytest.raises(WorkloadError, match="missing num_experts"):
        sweep.load(str(bad))
    with pytest.raises(WorkloadError, match="unknown sweep"):
        sweep.load("no-such-sweep")
    odd = tmp_path / "odd.toml"
    odd.write_text("hidden = 64\nnum_experts = 6\ntopk = 2\nnum_tokens = [16]\n")
    with pytest.raises(WorkloadError, match="not divisible"):
        sweep.workloads(sweep.load(str(odd)), {"ep": 4})


def test_cli_rejects_shape_flags_with_sweep(capsys):
    assert dispatch.main(["--sweep", "dsv3", "--num-tokens", "128", "--device", "cpu"]) == 2
    assert "drop them" in capsys.readouterr().err


def test_knob_stages_coordinate_search():
    axes = {"num_sms": [24, 8, 16], "env:CHUNK": [64, 128]}
    first, second = sweep.knob_stages(axes, {})
    assert first == [{"num_sms": 24, "env:CHUNK": 64}, {"num_sms": 8, "env:CHUNK": 64},
                     {"num_sms": 16, "env:CHUNK": 64}]
    assert second == [{"num_sms": 24, "env:CHUNK": 64}, {"num_sms": 24, "env:CHUNK": 128}]
    assert sweep.knob_stages(axes, {"num_sms": 16})[1] == [{"num_sms": 16, "env:CHUNK": 64},
                                                           {"num_sms": 16, "env:CHUNK": 128}]


def _rec(backend, T, phase, median, knobs, status="PASS", tagged=True):
    w = {"num_tokens": T, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16",
         "routing": "uniform", "seed": 0, "gpus_per_node": 8}
    r = {"workload": w, "backend": {"name": backend, "knobs": {} if tagged else dict(knobs)}, "phase": phase,
         "timing": {"median_us": median}, "check": {"status": status, "error": None}}
    if tagged:
        r["sweep"] = {"name": "dsv3", "case": "x", "knobs": dict(knobs)}
    return r


def test_best_knobs_picks_fastest_total():
    recs = []
    for sms, d, c in ((8, 300.0, 310.0), (16, 200.0, 260.0), (24, 210.0, 200.0), (32, 100.0, 900.0)):
        recs += [_rec("deepep", 4096, "dispatch", d, {"num_sms": sms}),
                 _rec("deepep", 4096, "combine", c, {"num_sms": sms})]
    # a failed setting and an untimed phase never win
    recs += [_rec("deepep", 4096, "dispatch", 1.0, {"num_sms": 48}, status="FAIL"),
             _rec("deepep", 4096, "combine", 1.0, {"num_sms": 48}, status="FAIL")]
    # plain (untagged) runs count through backend.knobs
    recs += [_rec("hybridep", 1024, "dispatch", 50.0, {"num_sms": 16}, tagged=False),
             _rec("hybridep", 1024, "combine", 60.0, {"num_sms": 16}, tagged=False),
             _rec("hybridep", 1024, "dispatch", 40.0, {"num_sms": 32}, tagged=False),
             _rec("hybridep", 1024, "combine", 40.0, {"num_sms": 32}, tagged=False)]
    best = {(e["backend"], e["workload"]["num_tokens"]): e for e in knobs.best_knobs(recs)}
    assert best[("deepep", 4096)]["knobs"] == {"num_sms": 24}
    assert best[("deepep", 4096)]["total_us"] == pytest.approx(410.0)
    assert best[("deepep", 4096)]["settings"] == 4
    assert best[("hybridep", 1024)]["knobs"] == {"num_sms": 32}


def _records(path):
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            assert line.startswith('{"schema": "moebench.res'), line    # only the line the test cut short
    return out


@pytest.mark.slow
def test_sweep_resumes_after_interruption(tmp_path, capsys):
    sw = tmp_path / "tiny.toml"
    sw.write_text(TINY)
    out = tmp_path / "out.jsonl"
    argv = ["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--backend", "alltoall", "--iters", "2",
            "--out", str(out)]
    assert dispatch.main(argv + ["--max-cases", "2"]) == 0          # "interrupted" after 2 of 3 cases
    first = capsys.readouterr().out
    assert "[1/3] tiny T=16 EP=2 alltoall" in first and "[2/3] tiny T=32" in first and "[3/3]" not in first
    recs = _records(out)
    assert sorted({r["workload"]["num_tokens"] for r in recs}) == [16, 32]
    assert all(r["check"]["status"] == "PASS" and r["sweep"]["name"] == "tiny" for r in recs)
    assert "--num-tokens 16" in recs[0]["repro"] or "--num-tokens 32" in recs[0]["repro"]
    with out.open("a") as f:                                       # a kill in the middle of a write
        f.write('{"schema": "moebench.res')
    assert dispatch.main(argv) == 0
    second = capsys.readouterr().out
    assert "[1/3] tiny T=16 EP=2 alltoall: already in" in second
    assert "[2/3] tiny T=32 EP=2 alltoall: already in" in second
    assert "ran 1, skipped 2" in second
    recs = _records(out)
    tokens = [r["workload"]["num_tokens"] for r in recs if r["phase"] == "dispatch"]
    assert sorted(tokens) == [16, 32, 48]                          # each case exactly once
    assert dispatch.main(argv) == 0
    assert "ran 0, skipped 3" in capsys.readouterr().out


@pytest.mark.slow
def test_knob_sweep_fixes_best_of_earlier_axis(tmp_path, capsys):
    sw = tmp_path / "knobs.toml"
    sw.write_text(TINY.replace("[16, 32, 48]", "[16]") +
                  '\n[knobs.alltoall]\nops_impl = ["torch", "auto"]\n"env:MOEBENCH_TEST_KNOB" = ["a", "b"]\n')
    out = tmp_path / "k.jsonl"
    argv = ["--sweep", str(sw), "--knob-sweep", "--device", "cpu", "--ep", "2", "--backend", "alltoall",
            "--iters", "2", "--out", str(out)]
    assert dispatch.main(argv) == 0
    text = capsys.readouterr().out
    assert "= 4 cases" in text and "best knobs" in text
    recs = _records(out)
    stage1 = [r for r in recs if r["sweep"]["knobs"]["env:MOEBENCH_TEST_KNOB"] == "a"]
    stage2 = [r for r in recs if r["sweep"]["knobs"]["env:MOEBENCH_TEST_KNOB"] == "b"]
    assert {r["sweep"]["knobs"]["ops_impl"] for r in stage1} == {"torch", "auto"}
    best_impl = knobs.best_knobs(stage1)[0]["knobs"]["ops_impl"]
    assert stage2 and {r["sweep"]["knobs"]["ops_impl"] for r in stage2} == {best_impl}
    assert all(r["backend"]["knobs"].get("ops_impl") == r["sweep"]["knobs"]["ops_impl"] for r in recs)
    assert "MOEBENCH_TEST_KNOB" not in os.environ                  # the env knob was set for the ranks only


def test_time_left_follows_the_work_of_the_remaining_cases():
    # six token counts x seven backends, as a dsv3 sweep: a 6 s launch plus time in proportion to the work
    wls = [Workload(num_tokens=t, hidden=7168, num_experts=256, topk=8, ep=8) for t in (512, 1024, 2048, 4096, 8192, 16384)]
    works = [eta.case_work(w) for w in wls for _ in range(7)]
    seconds = [6.0 + 2e-8 * x for x in works]
    done = 35                                             # at case 36 of 42
    truth = sum(seconds[done:])
    left = eta.time_left(list(zip(works[:done], seconds[:done])), works[done:])
    by_count = sum(seconds[:done]) / done * (len(works) - done)
    assert abs(left - truth) / truth < 0.05, (left, truth)
    assert truth / by_count > 2                           # what counting cases said: far too little
    assert eta.time_left([], works) is None
    same = eta.time_left([(100, 2.0), (100, 4.0)], [100, 300])
    assert same == 3.0 / 100 * 400                        # one work so far: in proportion


@pytest.mark.slow
def test_sweep_prints_time_left_by_work(tmp_path, capsys):
    sw = tmp_path / "s.toml"
    sw.write_text("num_experts = 8\ntopk = 2\nhidden = 64\nnum_tokens = [16, 32]\n")
    assert dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--backend", "alltoall", "--iters", "1",
                          "--out", str(tmp_path / "r.jsonl")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert "min left" not in lines[0] and "min left, by work)" in lines[1], lines
