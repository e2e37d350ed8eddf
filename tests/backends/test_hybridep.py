"""hybridep without deep_ep: limits, routing_map construction and the plain/permute weighting."""
import os
import sys

import pytest
import torch

from conftest import ROOT
from moebench.backends import Unavailable, get
from moebench.backends.base import routing_map_and_probs
from moebench.backends.deepep import group_by_local_expert, unpermuted_rows
from moebench.backends.hybridep import DOMAIN_ENV, HybridEPBackend, cuda_home, local_plain_inputs, ranks_per_domain
from moebench.core import reference, workload
from moebench.core.workload import Workload, WorkloadError
from moebench.env import toolkit


def test_registered_available_no_import():
    assert get("hybridep") is HybridEPBackend
    before = "deep_ep" in sys.modules
    ok, why = HybridEPBackend.available()
    assert ("deep_ep" in sys.modules) == before and (ok or "not installed" in why)


def test_limits(monkeypatch):
    monkeypatch.delenv(DOMAIN_ENV, raising=False)
    ok = Workload(num_tokens=16, hidden=512, num_experts=32, topk=4, ep=4, gpus_per_node=4)
    HybridEPBackend().validate(ok, 4)
    HybridEPBackend().validate(ok.replace(dtype="fp8"), 4)
    cases = [(ok.replace(hidden=520), 4, "divisible by 16"), (ok.replace(dtype="fp8", hidden=640), 4, "divisible by 512"),
             (ok.replace(ep=1), 1, "segfaults at world size 1"),
             (Workload(num_tokens=16, hidden=512, num_experts=6, topk=2, ep=2, gpus_per_node=2), 2, "% 4 == 0")]
    for w, world, msg in cases:
        with pytest.raises(WorkloadError, match=msg):
            HybridEPBackend().validate(w, world)
    with pytest.raises(WorkloadError, match="mode"):
        HybridEPBackend(knob_values={"mode": "fused"}).validate(ok, 4)
    monkeypatch.setenv(DOMAIN_ENV, "3")
    with pytest.raises(WorkloadError, match="multiple of the NVLink domain"):
        HybridEPBackend().validate(ok, 4)


def test_ranks_per_domain(monkeypatch):
    monkeypatch.delenv(DOMAIN_ENV, raising=False)
    assert ranks_per_domain(16, 8) == 8 and ranks_per_domain(4, 8) == 4
    monkeypatch.setenv(DOMAIN_ENV, "2")
    assert ranks_per_domain(16, 8) == 2
    monkeypatch.setenv(DOMAIN_ENV, "zero")
    with pytest.raises(WorkloadError):
        ranks_per_domain(16, 8)


def test_routing_map_matches_topk():
    w = Workload(num_tokens=50, hidden=128, num_experts=16, topk=4, ep=2, routing="uniform,masked:0.3", seed=2)
    _, idx, wt, _, _ = workload.rank_inputs(w, 0)
    assert (idx == -1).any()
    rmap, probs = routing_map_and_probs(idx, wt, 16)
    for t in range(50):
        chosen = {int(e) for e in idx[t] if e >= 0}
        assert set(torch.nonzero(rmap[t]).flatten().tolist()) == chosen
        for e, p in zip(idx[t].tolist(), wt[t].tolist()):
            if e >= 0:
                assert probs[t, e].item() == pytest.approx(p)
    assert torch.equal(probs > 0, rmap & (probs > 0)) and probs.sum().item() == pytest.approx(wt[idx >= 0].sum().item())


def test_plain_path_matches_the_oracle():
    """Rank 1 of a 2-rank domain receives every token with its local map; probs have 2 x L columns."""
    w = Workload(num_tokens=40, hidden=128, num_experts=8, topk=3, ep=2, gpus_per_node=2, seed=5)
    x, idx, wt, _, _ = workload.rank_inputs(w, 0)
    rmap, probs = routing_map_and_probs(idx, wt, 8)
    L, rank = 4, 1
    local_map = rmap[:, rank * L:(rank + 1) * L]
    recv = local_map.any(1)
    lidx, lw = local_plain_inputs(local_map[recv], probs[recv], rank)
    g = group_by_local_expert(x[recv], lidx, lw, L, impl="torch")
    tpe = [int(c) for c in g.tokens_per_expert]
    y = reference.apply_experts(g.x_RH, tpe, rank, w, probs_R=g.probs_R)     # the experts apply the probs
    part = unpermuted_rows(y, g, impl="torch")                     # what rank 1 hands to combine
    local_only = torch.where(idx >= rank * L, idx, -1)              # the oracle restricted to rank 1's experts
    exp = reference.expected_combine(x, local_only, wt, w)[recv]
    assert reference.check_combine(part, exp) == ""


def test_plain_probs_layout_two_domains():
    """2 NVLink domains x 2 ranks, L=2 (E=8): HybridEP's plain dispatch hands rank 3 (node 1, local rank 1)
    probs [N, L x 2] = the source rows' columns of node 1 (experts 4..7); rank 3's experts are columns 2..3."""
    w = Workload(num_tokens=40, hidden=128, num_experts=8, topk=3, ep=4, gpus_per_node=2, seed=4)
    _, idx, wt, _, _ = workload.rank_inputs(w, 0)
    rmap, probs = routing_map_and_probs(idx, wt, 8)
    L, node, local_rank = 2, 1, 1
    first = (node * 2 + local_rank) * L
    local_map = rmap[:, first:first + L]
    recv = local_map.any(1)
    probs_node = probs[recv][:, node * 2 * L:(node + 1) * 2 * L]      # width L x ranks per domain
    lidx, lw = local_plain_inputs(local_map[recv], probs_node, local_rank)
    assert torch.equal(lw, probs[recv][:, first:first + L] * local_map[recv])
    assert torch.equal(lidx >= 0, local_map[recv])


def test_permute_mode_sums_rows_the_experts_weighed():
    """combine_with_unpermute is unweighted: the experts apply each row's prob, then a plain sum must equal the
    oracle (and rows left unweighted must not)."""
    w = Workload(num_tokens=30, hidden=64, num_experts=4, topk=2, ep=1, seed=7)
    x, idx, wt, _, _ = workload.rank_inputs(w, 0)
    g = group_by_local_expert(x, idx, wt, 4, impl="torch")
    tpe = [int(c) for c in g.tokens_per_expert]
    valid, rows = g.row_map_NK >= 0, g.row_map_NK.long()

    def summed(y):
        out = torch.zeros(30, 64)
        for k in range(2):
            out += torch.where(valid[:, k:k + 1], y[rows[:, k].clamp(min=0)].float(), 0.0)
        return reference.check_combine(out.to(torch.bfloat16), reference.expected_combine(x, idx, wt, w))
    assert summed(reference.apply_experts(g.x_RH, tpe, 0, w, probs_R=g.probs_R)) == ""
    assert summed(reference.apply_experts(g.x_RH, tpe, 0, w)) != ""
