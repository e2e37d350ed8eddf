"""The chained view (harness/views/chained.py): free-running dispatch -> combine pairs on a real 2-rank gloo run of
the alltoall backend, reduced over ranks, its last pair checked by the oracle; a backend without a pair free of host
syncs says why."""
import time

import pytest

from moebench.backends import base
from moebench.backends.alltoall import AlltoallBackend
from moebench.core.workload import Workload, rank_inputs
from moebench.harness import oracle
from moebench.harness.launch import run_ranks
from moebench.harness.spec import RunSpec
from moebench.harness.stage import make_case
from moebench.harness.timing import Timer
from moebench.harness.views import chained

W = Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2)
W1 = Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=1)


def _alltoall_pair(ctx, w):
    """The alltoall backend on torch ops, checked once by the oracle: (oracle error, its Case, its chained plan)."""
    b = AlltoallBackend(knob_values={"ops_impl": "torch"})
    b.setup(ctx.group, w, ctx.device)
    x, idx, wt, q, s = rank_inputs(w, ctx.rank)
    err, d, y = oracle.check(b, w, ctx.rank, x, idx, wt, s, ctx.device)
    case = make_case(b, Timer(ctx.device, ctx.group), ctx, RunSpec(w, ("alltoall",), iters=3), (x, idx, wt, s), d, y)
    return err, case, b.chained_plan(x, idx, wt, s, d, y)


def _chains(ctx):
    """A clean chain, then one whose combine on rank 1 comes back doubled: (oracle error, both views, pairs made)."""
    err, case, plan = _alltoall_pair(ctx, W)
    real, calls, corrupt = plan.combine, [], [False]

    def combine(dg):
        calls.append(1)
        out = real(dg)
        return out * 2 if (corrupt[0] and ctx.rank == 1) else out
    plan.combine = combine
    clean = chained.chain(case.timer, plan, kept=3, drop=1, check=case.check, wait_s=30)
    made, corrupt[0] = len(calls), True
    return err, clean, chained.chain(case.timer, plan, kept=3, drop=1, check=case.check, wait_s=30), made


def test_chain_reduces_every_pair_over_ranks_and_the_oracle_checks_its_last_pair():
    for err, v, bad, made in run_ranks(_chains, 2, "cpu", timeout_s=60):
        assert err == "" and "fail" not in v, v
        assert v["pairs"] == 3 and v["dropped"] == 1 and len(v["samples_us"]) == 3
        assert made == 1 + 3                          # one dropped (a CPU run's warm-up), three kept
        assert v["us"] == pytest.approx(sorted(v["samples_us"])[1], abs=1e-3) and v["max_over_ranks_us"] == v["us"]
        # the slowest rank's window is never below the median rank's (2 ranks: the median is the lower)
        assert v["median_over_ranks_us"] <= v["us"] and v["spread_us"] >= 0
        assert v["covers"] == "dispatch -> combine round trip" and "gloo" in v["mode"]
        # rank 1's doubled combine: every rank reports the failure (no rank goes on alone)
        assert bad["fail"].startswith("the chain's last pair:"), bad


def test_chain_length_is_collectivex_s_on_a_gpu_and_iters_on_cpu():
    assert chained.chain_length(20, cuda=True) == (112, 16)         # 128 pairs, 16 dropped
    assert chained.chain_length(500, cuda=True) == (500, 16)
    assert chained.chain_length(5, cuda=False) == (5, 1)


class _NoPair(base.Backend):
    name = "test-no-pair"
    no_graph_view = "a host sync in every call (stand-in)"


def test_a_backend_without_a_sync_free_pair_says_why():
    why = _NoPair().chained_plan(*[None] * 6)
    assert why == "no dispatch -> combine pair known free of host syncs: a host sync in every call (stand-in)"


def _chain_with_a_slow_between(ctx):
    """The alltoall pair with a between step that takes 50 ms (as ncclep's correctness expert runs between)."""
    _, case, plan = _alltoall_pair(ctx, W1)
    plain = chained.chain(case.timer, plan, kept=3, drop=1, check=case.check, wait_s=30)
    plan.between = lambda dg: time.sleep(0.05)
    return plain, chained.chain(case.timer, plan, kept=3, drop=1, check=case.check, wait_s=30)


def test_the_step_between_a_pairs_calls_is_timed_apart_and_out_of_its_window():
    for plain, slow in run_ranks(_chain_with_a_slow_between, 1, "cpu", timeout_s=60):
        assert "between" not in plain and "fail" not in slow, slow
        assert slow["between_us"] >= 50_000 and "taken out of each window" in slow["between"]
        assert slow["us"] < 50_000 and slow["us"] < 10 * plain["us"] + 5_000, (plain["us"], slow["us"])
