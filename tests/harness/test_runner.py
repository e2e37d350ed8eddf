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


def test_a_backend_that_weighs_in_combine_too_fails_the_check():
    """The experts apply the probs dispatch handed them (as Megatron's do); a combine that weighs again squares the
    weights: FAIL before any timing, on every rank."""
    outs = run_ranks(run_fake, 2, "cpu", timeout_s=60, args=("test-weighs-twice", "conftest:WeighsTwice"))
    assert {o.status for o in outs} == {"FAIL"}
    assert outs[0].error.startswith("combine: combine token") and outs[0].phases == {}
    right = run_ranks(run_fake, 2, "cpu", timeout_s=60, args=("alltoall", "moebench.backends.alltoall:AlltoallBackend"))
    assert {o.status for o in right} == {"PASS"}
    assert right[0].knobs["num_sms_used"] == "gloo"        # what ran: the host's exchange, no SMs (not "nccl")
