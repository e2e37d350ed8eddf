"""Every peer's byte rule (core/peer_rules.py) on one routing small enough to count by hand.

4 ranks, 2 per node (node 0: ranks 0, 1; node 1: ranks 2, 3), 2 experts per rank (expert e on rank e // 2),
H 256 (bf16 row 512 B; fp8 row 256 + 2 scales x 4 = 264 B). Rank 0 sends three tokens, ranks 1..3 nothing:
  t0 -> experts 0, 2   ranks 0 (itself) and 1, both on node 0   2 pairs, 2 slots, 1 (token, node) pair (own node)
  t1 -> expert 7, -1   rank 3, node 1                            1 pair,  1 slot,  1 (token, node) pair
  t2 -> experts 4, 5   rank 2 twice, node 1                      1 pair,  2 slots, 1 (token, node) pair
Totals: 4 (token, rank) pairs, 5 (token, k) slots, 3 remote pairs (not rank 0 itself), 4 remote slots, 2 off-node
pairs, 3 off-node slots, 3 (token, node) pairs of which 2 off-node. Every figure is a mean over the 4 ranks.
"""
import pytest
import torch

from moebench.core import peer_rules, traffic
from moebench.core.workload import Workload

W = Workload(num_tokens=3, hidden=256, num_experts=8, topk=2, ep=4, gpus_per_node=2)
IDX0 = torch.tensor([[0, 2], [7, -1], [4, 5]])
BF16, FP8 = 512, 264


def rule(fn, phase="dispatch", w=W):
    t = traffic.traffic_of([IDX0] + [torch.full((3, 2), -1)] * 3, w)
    return fn(t, w, phase)


def test_hand_counts_of_the_routing():
    t = traffic.traffic_of([IDX0] + [torch.full((3, 2), -1)] * 3, W)
    assert t.pairs_SD.sum() == 4 and t.slots_SD.sum() == 5
    assert t.node_pairs_S.tolist() == [3, 0, 0, 0] and t.own_node_pairs_S.tolist() == [1, 0, 0, 0]


def test_collectivex_counts_token_rank_pairs_self_included_payload_only():
    assert rule(peer_rules.collectivex) == {"collectivex_bytes": 4 / 4 * BF16}
    assert rule(peer_rules.collectivex, w=W.replace(dtype="fp8")) == {"collectivex_bytes": 4 / 4 * FP8}
    assert rule(peer_rules.collectivex, "combine", W.replace(dtype="fp8")) == {"collectivex_bytes": 4 / 4 * BF16}


def test_aws_fair_counts_every_valid_selection_and_scaleout_by_node():
    assert rule(peer_rules.aws_fair) == {"aws_fair_bytes": 5 / 4 * BF16, "aws_fair_scaleout_bytes": 3 / 4 * BF16}
    fp8 = rule(peer_rules.aws_fair, w=W.replace(dtype="fp8"))       # H + ceil(H / 128) x 4 = 264
    assert fp8["aws_fair_bytes"] == pytest.approx(5 / 4 * FP8)
    assert rule(peer_rules.aws_fair, "combine", W.replace(dtype="fp8"))["aws_fair_bytes"] == 5 / 4 * BF16


def test_nccl_tests_alltoall_busbw_is_the_uniform_n_minus_1_over_n():
    d = rule(peer_rules.nccl_tests_alltoall)
    assert d == {"nccl_tests_alltoall_bytes": 512.0, "nccl_tests_alltoall_bus_bytes": 512.0 * 3 / 4}
    # the run's real remote share is 3 of 4 pairs here too, by chance; on one rank busbw is 0
    one = Workload(num_tokens=3, hidden=256, num_experts=8, topk=2, ep=1)
    t1 = traffic.traffic_of([IDX0], one)
    assert peer_rules.nccl_tests_alltoall(t1, one, "dispatch")["nccl_tests_alltoall_bus_bytes"] == 0


def test_flashinfer_counts_remote_pairs_once_plus_8_bytes_per_remote_selection():
    # 3 remote pairs x 512 + 4 remote selections x (4 + 4)
    assert rule(peer_rules.flashinfer) == {"flashinfer_bytes": (3 * BF16 + 4 * 8) / 4}
    assert rule(peer_rules.flashinfer, "combine") == {"flashinfer_bytes": 3 * BF16 / 4}
    # its fp8_block_scale recipe is counted at the bf16 input size (its else branch), as written
    assert rule(peer_rules.flashinfer, w=W.replace(dtype="fp8")) == {"flashinfer_bytes": (3 * BF16 + 4 * 8) / 4}


def test_ep_bench_ht_since_0721_dedups_per_rank_and_splits_rdma_by_node():
    assert rule(peer_rules.ep_bench_ht) == {"ep_bench_ht_bytes": 4 / 4 * BF16, "ep_bench_ht_rdma_bytes": 2 / 4 * BF16}
    # the combine prints the same (dispatch-payload) figures, fp8 included
    c = rule(peer_rules.ep_bench_ht, "combine", W.replace(dtype="fp8"))
    assert c["ep_bench_ht_bytes"] == 4 / 4 * FP8


def test_ep_bench_ht_before_0721_dedups_per_node():
    d = rule(peer_rules.ep_bench_ht_before_0721)
    assert d == {"ep_bench_ht_send_before_0721_bytes": 3 / 4 * BF16,
                 "ep_bench_ht_rdma_send_before_0721_bytes": 2 / 4 * BF16}
    one_node = W.replace(gpus_per_node=4)                       # no rdma figure on one node
    assert set(rule(peer_rules.ep_bench_ht_before_0721, w=one_node)) == {"ep_bench_ht_send_before_0721_bytes"}
    # one node: every token that goes anywhere is one (token, node) pair: 3 tokens
    assert rule(peer_rules.ep_bench_ht_before_0721, w=one_node)["ep_bench_ht_send_before_0721_bytes"] == 3 / 4 * BF16


def test_deepep_and_hybridep_nvl_are_received_pairs_with_a_bf16_combine():
    for fn, key in ((peer_rules.deepep_nvl, "deepep_nvl_bytes"), (peer_rules.hybridep_nvl, "hybridep_nvl_bytes")):
        assert rule(fn, w=W.replace(dtype="fp8")) == {key: 4 / 4 * FP8}
        assert rule(fn, "combine", W.replace(dtype="fp8")) == {key: 4 / 4 * BF16}


def test_upstream_bytes_holds_every_rule_and_moebench_algbw_equals_the_nvl_rules():
    t = traffic.traffic_of([IDX0] + [torch.full((3, 2), -1)] * 3, W)
    up = traffic.upstream_bytes(t, W, "dispatch")
    for fn in traffic.UPSTREAM_RULES:
        assert set(fn(t, W, "dispatch")) <= set(up), fn.__name__
    algbw = traffic.phase_bytes(t, W, "dispatch", dedup=True)["bytes"]
    assert up["deepep_nvl_bytes"] == up["hybridep_nvl_bytes"] == up["collectivex_bytes"] == algbw
