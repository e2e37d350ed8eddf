"""The byte rule on hand-computed cases."""
import pytest
import torch

from moebench import traffic
from moebench.workload import Workload


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
