"""Every rank agrees on a backend's fate before anyone enters a collective."""

from moebench.backends import base
from moebench.core.workload import Workload
from moebench.harness.launch import run_ranks
from moebench.harness.runner import rank_main
from moebench.harness.spec import RunSpec

W = Workload(num_tokens=8, hidden=64, num_experts=4, topk=2, ep=2)


def run_fake(ctx, name, cls_path):
    base.REGISTRY[name] = cls_path
    return rank_main(ctx, RunSpec(W, (name,), iters=1), name, measure=False)


def test_a_backend_waived_on_one_rank_is_waived_on_all():
    outs = run_ranks(run_fake, 2, "cpu", timeout_s=60, args=("test-waive-rank1", "conftest:WaiveOnRank1"))
    assert [o.status for o in outs] == ["WAIVED", "WAIVED"]
    assert outs[0].error == "no widget on rank 1"


def test_wrong_tokens_fail_the_check_and_skip_timing():
    outs = run_ranks(run_fake, 2, "cpu", timeout_s=60, args=("test-wrong", "conftest:WrongTokens"))
    assert {o.status for o in outs} == {"FAIL"}
    assert outs[0].error.startswith("dispatch: rank") and outs[0].phases == {}


def test_cases_of_one_backend_share_one_launch(monkeypatch):
    """run_cases: bf16 and fp8 on the same two ranks, one launch, each case's records as run_case builds them; a
    case another launch would need is refused before any."""
    from moebench.harness import runner
    launches = []
    real = runner.run_ranks
    monkeypatch.setattr(runner, "run_ranks", lambda *a, **k: (launches.append(a[0].__name__), real(*a, **k))[1])
    specs = [RunSpec(W.replace(dtype=d, hidden=128), ("alltoall",), iters=1, views=("api",)).check() for d in ("bf16", "fp8")]
    got = runner.run_cases(specs, "alltoall")
    assert launches == ["rank_cases"]
    for spec, recs in zip(specs, got):
        assert [(r["phase"], r["check"]["status"], r["workload"]["dtype"]) for r in recs] == [
            ("dispatch", "PASS", spec.workload.dtype), ("combine", "PASS", spec.workload.dtype)]
        assert recs[0]["argv"] == spec.to_argv() and recs[0]["functional"]
    import pytest
    with pytest.raises(ValueError, match="one launch cannot serve"):
        runner.run_cases([specs[0], specs[0].replace(workload=W.replace(ep=4, num_experts=8))], "alltoall")
