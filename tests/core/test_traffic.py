"""The byte rule on hand-computed cases."""
import pytest
import torch

from moebench.core import traffic
from moebench.core.workload import Workload


def w4(**kw):
    # 4 ranks, 2 experts each: expert e lives on rank e // 2
    return Workload(**{**dict(num_tokens=3, hidden=8, num_experts=8, topk=2, ep=4, gpus_per_node=2), **kw})


def test_pairs_dedupe_per_rank_and_slots_do_not():
    w = w4()
    idx = torch.tensor([[0, 1],     # both experts on rank 0: one pair, two slots
                        [2, 7],     # ranks 1 and 3
                        [-1, 5]])   # masked slot goes nowhere; rank 2
    pairs, slots = traffic.count_pairs(idx, w)
    assert pairs.tolist() == [1, 1, 1, 1]
    assert slots.tolist() == [2, 1, 1, 1]


def test_tokens_only_to_own_rank_cross_no_link():
    w = w4()
    own = [torch.tensor([[2 * r, 2 * r + 1]] * 3) for r in range(4)]
    t = traffic.traffic_of(own, w)
    c = t.per_rank()
    assert c["pairs"].tolist() == [3, 3, 3, 3]
    assert c["remote_pairs"].sum() == 0 and c["remote_slots"].sum() == 0
    b = traffic.phase_bytes(t, w, "dispatch", dedup=True)
    assert b["bytes"] == 3 * 16 and b["bus_bytes"] == 0 and b["wire_bytes"] == 0


def test_nvlink_and_net_split_by_node_and_idle_experts():
    w = w4()
    # rank 0 sends token 0 to rank 1 (same node), token 1 to rank 2 (other node); rank 3 gets nothing
    routings = [torch.tensor([[2, 3], [4, -1], [0, -1]])] + [torch.tensor([[-1, -1]] * 3)] * 3
    c = traffic.traffic_of(routings, w).per_rank()
    assert c["pairs"].tolist() == [1, 1, 1, 0]
    assert c["nvlink_pairs"].tolist() == [0, 1, 0, 0]
    assert c["net_pairs"].tolist() == [0, 0, 1, 0]
    assert c["remote_slots"].tolist() == [0, 2, 1, 0]


def test_phase_bytes_and_bandwidth():
    w = w4(dtype="fp8", hidden=256)
    routings = [torch.tensor([[2, 3], [4, -1], [0, -1]])] + [torch.tensor([[-1, -1]] * 3)] * 3
    t = traffic.traffic_of(routings, w)
    d = traffic.phase_bytes(t, w, "dispatch", dedup=False)
    bpt = 256 + 4 * 2
    assert d["bytes"] == pytest.approx(3 / 4 * bpt)          # 3 pairs over 4 ranks
    assert d["bus_bytes"] == pytest.approx(2 / 4 * bpt)
    assert d["wire_bytes"] == pytest.approx(3 / 4 * (bpt + 4))  # slots, plus the probs a2a
    c = traffic.phase_bytes(t, w, "combine", dedup=True)
    assert c["bytes"] == pytest.approx(3 / 4 * 512)            # combine is bf16
    assert c["wire_bytes"] == c["bus_bytes"]
    bw = traffic.bandwidth(c, 1e-6)
    assert bw["algbw_GBps"] == pytest.approx(3 / 4 * 512 * 1e-3)
    assert bw["nvlink_GBps"] + bw["net_GBps"] == pytest.approx(bw["busbw_GBps"])


def w16(**kw):
    # 16 ranks on 2 nodes of 8, one expert per rank: expert e on rank e, node e // 8
    return Workload(**{**dict(num_tokens=3, hidden=256, num_experts=16, topk=3, ep=16, gpus_per_node=8), **kw})


def test_node_pairs_count_the_senders_own_node():
    w = w16()
    idx = torch.tensor([[0, 1, 2],       # all on node 0 (the sender's own): 1 pair
                        [3, 8, 9],       # node 0 and node 1: 2 pairs
                        [-1, 15, -1]])   # node 1 only: 1 pair
    assert traffic.count_node_pairs(idx, w) == 4
    assert traffic.count_node_pairs(torch.full((3, 3), -1), w) == 0


def test_upstream_rules_hand_computed():
    """Rank 0 sends the three tokens above, ranks 1..15 send nothing (all masked): mean over 16 ranks."""
    w = w16(dtype="fp8")
    idx0 = torch.tensor([[0, 1, 2], [3, 8, 9], [-1, 15, -1]])
    t = traffic.traffic_of([idx0] + [torch.full((3, 3), -1)] * 15, w)
    d = traffic.upstream_bytes(t, w, "dispatch")
    c = traffic.upstream_bytes(t, w, "combine")
    fp8_row = 256 + 8                        # = 2H x (1 + 4/128) / 2
    assert d["deepep_rdma_bytes"] == pytest.approx(4 * fp8_row / 16)
    assert c["deepep_rdma_bytes"] == pytest.approx(4 * 512 / 16)              # DeepEP's combine: bf16
    assert d["hybridep_rdma_bytes"] == c["hybridep_rdma_bytes"] == pytest.approx(4 * fp8_row / 16)   # HybridEP: reused
    slots = 7                                # valid (token, k) slots
    assert d["deepep_ll_bytes"] == pytest.approx(slots * (256 + 256 // 128 * 4 + 16) / 16)
    assert c["deepep_ll_bytes"] == pytest.approx(slots * 512 / 16)


def test_upstream_rdma_only_across_nodes():
    w = w4()                                  # 4 ranks, 2 per node: 2 nodes
    idx = torch.tensor([[0, 1], [2, 7], [-1, 5]])
    t = traffic.traffic_of([idx] * 4, w)
    d = traffic.upstream_bytes(t, w, "dispatch")
    assert d["deepep_rdma_bytes"] == pytest.approx(4 * 16)   # per rank: 1 + 2 + 1 (token, node) pairs x 2H
    one_node = w.replace(gpus_per_node=4)
    d1 = traffic.upstream_bytes(traffic.traffic_of([idx] * 4, one_node), one_node, "dispatch")
    assert {"deepep_ll_bytes", "ncclep_ll_bytes", "deepep_v2_bytes"} <= set(d1)
    assert not {k for k in d1 if "rdma" in k}


def test_ncclep_ll_and_deepep_v2_rules_tell_pairs_from_slots():
    """Per rank: token 0 -> experts 0, 1 (both rank 0: 1 pair, 2 slots), token 1 -> ranks 1 and 3, token 2 -> rank 2:
    4 (token, rank) pairs and 5 (token, k) slots; 2H = 16 bytes, K = 2."""
    w = w4()
    t = traffic.traffic_of([torch.tensor([[0, 1], [2, 7], [-1, 5]])] * 4, w)
    d, c = traffic.upstream_bytes(t, w, "dispatch"), traffic.upstream_bytes(t, w, "combine")
    assert d["ncclep_ll_bytes"] == 4 * 16 and c["ncclep_ll_bytes"] == 5 * 16       # messages; selections
    assert d["deepep_v2_bytes"] == 4 * (16 + 12 * 2) and c["deepep_v2_bytes"] == 4 * (16 + 4 * 2)
