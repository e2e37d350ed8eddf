"""Every rank agrees on a backend's fate before anyone enters a collective."""

from moebench.backends import base
from moebench.core.workload import Workload
from moebench.harness.launch import run_ranks
from moebench.harness.runner import rank_main
from moebench.harness.spec import RunSpec

W = Workload(num_tokens=8, hidden=64, num_experts=4, topk=2, ep=2)


def run_fakes(ctx, fakes):
    """rank_main for each (name, "conftest:Class") in turn, on the same ranks (registered in the rank: the rank
    processes import them by that path)."""
    out = []
    for name, cls_path in fakes:
        base.REGISTRY[name] = cls_path
        out.append(rank_main(ctx, RunSpec(W, (name,), iters=1), name, measure=False))
    return out


def test_every_rank_agrees_on_a_backends_fate_and_the_next_case_still_runs():
    """A backend WAIVED on one rank is WAIVED on all; wrong tokens FAIL the check on every rank and skip timing; and
    the ranks, having agreed, run the next case (one launch for both: what run_cases relies on)."""
    fakes = [("test-waive-rank1", "conftest:WaiveOnRank1"), ("test-wrong", "conftest:WrongTokens"),
             ("test-weighs-twice", "conftest:WeighsTwice"), ("alltoall", "moebench.backends.alltoall:AlltoallBackend")]
    waived, wrong, twice, fine = zip(*run_ranks(run_fakes, 2, "cpu", timeout_s=60, args=(fakes,)))
    assert [o.status for o in waived] == ["WAIVED", "WAIVED"]
    assert waived[0].error == "no widget on rank 1"
    assert {o.status for o in wrong} == {"FAIL"}
    assert wrong[0].error.startswith("dispatch: rank") and wrong[0].phases == {}
    # the experts apply the probs dispatch handed them (as Megatron's do): a combine that weighs again squares them
    assert {o.status for o in twice} == {"FAIL"}
    assert twice[0].error.startswith("combine: combine token") and twice[0].phases == {}
    assert [o.status for o in fine] == ["PASS", "PASS"] and set(fine[0].phases) >= {"dispatch", "combine"}
    assert fine[0].knobs["num_sms_used"] == "gloo"        # what ran: the host's exchange, no SMs (not "nccl")

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
