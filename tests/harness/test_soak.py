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
from moebench.harness.launch import run_ranks
from moebench.harness.runner import rank_main
from moebench.harness.soak import soak_main
from moebench.harness.spec import RunSpec
from moebench.records import dispatch as records
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

    from moebench.harness import soak
    (tmp_path / "rank0.json").write_text('{"done": 5}')
    assert soak._advancing(str(tmp_path), 30.0)
    old = time.time() - 60
    os.utime(tmp_path / "rank0.json", (old, old))
    assert not soak._advancing(str(tmp_path), 30.0)
