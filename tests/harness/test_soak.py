"""Soak (--soak N): every call on fresh routing checked, so rare silent corruption the one check before timing
passes is FAIL with the calls and rows named; a crash mid-soak is FAIL with the call and the signal, and the
timed records before it are kept."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from moebench.backends import base
from moebench.core.workload import Workload
from moebench.harness import soak
from moebench.harness.launch import run_ranks
from moebench.harness.runner import rank_main
from moebench.harness.soak import soak_main
from moebench.harness.spec import RunSpec
from moebench.records import dispatch as records
from moebench.records import schema
from moebench.records.shapes import binomial_upper

W = Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2)


def check_then_soak(ctx, spec):
    base.REGISTRY["test-flaky"] = "conftest:FlakyCombine"
    timed = rank_main(ctx, spec, "test-flaky", measure=False)
    return timed.status, soak_main(ctx, spec, "test-flaky", None)


@pytest.mark.slow
def test_the_check_passes_a_flaky_combine_and_the_soak_fails_it():
    spec = RunSpec(W, ("test-flaky",), iters=2, soak=150, views=("api",))
    outs = run_ranks(check_then_soak, 2, "cpu", timeout_s=240, args=(spec,))
    assert [status for status, _ in outs] == ["PASS", "PASS"]         # one check before timing: passed
    s = records.soak_of(150, [r for _, r in outs], None, None)
    status, why = records.soak_verdict(s)
    assert status == "FAIL" and s.calls == 150 and 4 <= s.corrupted_calls <= 8, s
    assert s.first_bad_call is not None and s.first_bad_call > 0 and s.corrupted_tokens >= s.corrupted_calls
    assert s.bad[0]["tokens"] == [3] and f"first at call {s.first_bad_call}" in why and "tokens [3]" in why
    assert s.upper_95 > s.corrupted_calls / s.calls


def rebuild_soak(ctx, spec):
    base.REGISTRY["test-rebuild"] = "conftest:WrongAfterRebuild"
    return soak_main(ctx, spec, "test-rebuild", None)


def test_a_soak_that_rebuilds_its_backend_counts_the_rebuilds_and_finds_one_that_comes_back_wrong():
    """--soak-recreate 2: the backend destroyed and built again before call 2; from there its combine is wrong."""
    spec = RunSpec(W, ("test-rebuild",), iters=1, soak=4, soak_recreate=2, views=("api",))
    outs = run_ranks(rebuild_soak, 2, "cpu", timeout_s=120, args=(spec,))
    s = records.soak_of(4, outs, None, None, every=2)
    assert (s.calls, s.corrupted_calls, s.first_bad_call) == (4, 2, 2), s
    assert s.rebuilt["every"] == 2 and s.rebuilt["count"] == 1 and s.rebuilt["max_ms"] >= 0
    assert records.soak_verdict(s)[0] == "FAIL"


def test_rate_bound_when_nothing_failed():
    assert f"{100 * binomial_upper(0, 10000):.2g}" == "0.03"           # "0 of 10000: < 0.03% at 95%"
    assert binomial_upper(0, 2000) == pytest.approx(1 - 0.05 ** (1 / 2000), rel=1e-6)
    s = records.soak_of(2000, [{"done": 2000, "bad_calls": [], "rows": 0, "tokens": 0}] * 2, None, None)
    assert s.summary == "0 of 2000: < 0.15% at 95%" and records.soak_verdict(s) == ("PASS", "")


def test_corrupted_rows_are_named_by_expert():
    ranks = [{"done": 100, "bad_calls": [7], "rows": 2, "tokens": 1,
              "bad": [{"call": 7, "rank": 1, "rows": [[5, 2]], "tokens": [0], "n_tokens": 1}]},
             {"done": 100, "bad_calls": [], "rows": 0, "tokens": 0, "bad": []}]
    status, why = records.soak_verdict(records.soak_of(100, ranks, None, None))
    assert status == "FAIL" and "1 of 100 calls corrupted" in why and "expert 5: 2 row(s)" in why and "rank 1" in why


@pytest.mark.slow
def test_a_crash_mid_soak_is_fail_with_the_call_and_signal_and_keeps_the_timed_records(tmp_path):
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "MOEBENCH_BACKENDS": "test-crash-late=conftest:CrashesInSoak",
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}"}
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", "--device", "cpu", "--ep", "2", "--num-tokens",
                        "16", "--hidden", "64", "--num-experts", "8", "--topk", "2", "--iters", "2", "--backend",
                        "test-crash-late", "--soak", "100", "--timeout", "120", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["phase"], r["check"]["status"]) for r in recs] == [("dispatch", "PASS"), ("combine", "PASS"),
                                                                  ("soak", "FAIL")]
    s = recs[-1]["soak"]
    assert s["stopped"]["how"] == "SIGSEGV" and 0 < s["calls"] < 100 and s["asked"] == 100
    assert recs[-1]["check"]["crash"] == "SIGSEGV" and "soak stopped at call" in recs[-1]["check"]["error"]
    assert "# soak test-crash-late: FAIL" in p.stdout


def test_a_soak_still_advancing_is_a_timeout_not_a_hang(tmp_path):
    import time

    (tmp_path / "rank0.json").write_text('{"done": 5}')
    assert soak._advancing(str(tmp_path), 30.0)
    old = time.time() - 60
    os.utime(tmp_path / "rank0.json", (old, old))
    assert not soak._advancing(str(tmp_path), 30.0)


@pytest.mark.slow
def test_a_soak_its_budget_ends_with_none_corrupted_is_budget_exit_3_with_where_its_time_went(tmp_path):
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", "--device", "cpu", "--ep", "2", "--num-tokens",
                        "16", "--hidden", "64", "--num-experts", "8", "--topk", "2", "--iters", "2", "--backend",
                        "alltoall", "--views", "api", "--soak", "1000000", "--soak-seconds", "4", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 3, p.stdout + p.stderr
    rec = [json.loads(line) for line in out.read_text().splitlines()][-1]
    s = rec["soak"]
    assert rec["check"]["status"] == "BUDGET" and s["corrupted_calls"] == 0
    assert 0 < s["calls"] < s["asked"] == 1000000 and s["budget"] == {"by": "--soak-seconds", "seconds": 4.0,
                                                                        "calls": s["calls"]}
    assert set(s["stage_ms"]) == set(soak.STAGES) and all(v >= 0 for v in s["stage_ms"].values())
    assert sum(s["stage_ms"].values()) * s["calls"] / 1e3 <= 4.0 * 1.5 and s["checked_on"] == "cpu"
    assert f"# soak alltoall: BUDGET 0 of {s['calls']}" in p.stdout and "--soak-seconds ran out" in p.stdout
    assert rec["backend"]["knobs"]["ops_impl"] == "auto" and "num_sms_used" in rec["backend"]["knobs"]   # as phases'


def test_a_soak_the_timeout_cut_while_advancing_is_budget_and_a_crash_is_still_fail():
    ranks = [{"done": 40, "bad_calls": [], "rows": 0, "tokens": 0}] * 2
    s = records.soak_of(2000, ranks, "out of time (300 s in)", "timeout")
    assert records.soak_verdict(s)[0] == "BUDGET" and s.budget["by"] == "--timeout" and s.stopped is None
    s = records.soak_of(2000, ranks, "rank 1 died", "SIGSEGV")
    assert records.soak_verdict(s)[0] == "FAIL" and s.budget is None
    bad = [{"done": 40, "bad_calls": [3], "rows": 1, "tokens": 0, "bad": [{"call": 3, "rank": 0, "rows": [[1, 1]]}]}]
    assert records.soak_verdict(records.soak_of(2000, bad, "out of time", "timeout"))[0] == "FAIL"
    assert schema.exit_code([{"check": {"status": "BUDGET"}}, {"check": {"status": "PASS"}}]) == 3
    assert schema.exit_code([{"check": {"status": "BUDGET"}}, {"check": {"status": "FAIL"}}]) == 1


def one_checked_call(ctx):
    w = Workload(num_tokens=16, hidden=128, num_experts=4, topk=2, ep=1, dtype="fp8")
    b = base.get("alltoall")(knob_values={"ops_impl": "torch"})
    b.setup(ctx.group, w, ctx.device)
    clock = {}
    return soak.one_call(b, w, 0, ctx.device, "cpu", clock), clock


def test_shared_gpu_ranks_check_on_the_host_and_one_call_times_every_stage():
    from types import SimpleNamespace

    import torch
    assert soak.check_device(SimpleNamespace(ranks_per_gpu=2, device=torch.device("cuda", 0))).type == "cpu"
    assert soak.check_device(SimpleNamespace(ranks_per_gpu=1, device=torch.device("cuda", 0))).type == "cuda"
    [(wrong, clock)] = run_ranks(one_checked_call, 1, "cpu", timeout_s=120)
    assert wrong is None and set(clock) == set(soak.STAGES) and all(v >= 0 for v in clock.values())
