"""The byte rule: one rule, three named figures, the same for every backend.

For every (source rank s, destination rank d), count
  pairs[s, d]  tokens of s with at least one expert on d (a token travels to d once)
  slots[s, d]  (token, k) slots of s whose expert lives on d (what a non-deduplicating path sends)
Then for rank r:
  algbw  = sum_s pairs[s, r] * bytes_per_token / t            local pairs included (DeepEP's "NVL bytes")
  busbw  = sum_{s != r} pairs[s, r] * bytes_per_token / t     what crossed links; split nvlink / net by node
  wirebw = bytes the backend really moved / t                 dedup backends: = busbw bytes;
                                                              alltoall: remote slots (+ 4-byte probs)
Combine sends the same pairs back, always in bf16. Per-rank figures are averaged over ranks and the
time t is the per-iteration max over ranks (timing.py), so a slow rank slows everybody's figure.

Upstream byte rules (upstream_bytes), named figures beside moebench/1, as DeepEP's, HybridEP's and NCCL EP's
own tests count them (DeepEP V1/HybridEP: branch hybrid-ep), so a record can be set beside their tables:
  deepep_rdma_bytes    tests/test_internode.py: (token, node) pairs sent, the sender's own node
                       included (num_rdma_token_sent), x 2H; dispatch fp8 x (1 + 4/128)/2
  deepep_ll_bytes      tests/test_low_latency.py: per routed (token, k) slot (-1 excluded), dispatch
                       (H + H/128*4 + 16) bytes (its fp8 dispatch, whatever this run's dtype), combine 2H
  hybridep_rdma_bytes  tests/test_hybrid_ep.py: count_rdma_send_from_routing_map (the same (token, node)
                       pairs, local node kept "to align with DeepEP") x 2H x fp8 factor, and its combine
                       reuses the dispatch figure, fp8 factor included
  ncclep_ll_bytes      NCCL EP's ep_bench, low-latency (since nccl-extensions 412ac5f): dispatch = (token,
                       destination rank) messages x payload (its FWD fp8: rows + scales), combine = valid (token, k)
                       selections x 2H; its high-throughput rule counts received (source rank, token) pairs, own rank
                       included, x payload: moebench's algbw bytes, so it has no figure of its own
  deepep_v2_bytes      DeepEP V2's tests/elastic/test_ep.py: received (token, rank) rows, local included, x what
                       each carries: dispatch payload + top-k ids (int64) + weights (fp32), combine 2H + weights
The RDMA figures exist only when the run spans nodes (their tests print them only then). A node is
gpus_per_node ranks: DeepEP's internode mode needs 8 (NUM_MAX_NVL_PEERS); HybridEP's is its NVLink
domain, which the hybridep backend records in its knobs. The neutral harnesses' rules (CollectiveX, AWS's
fair harness, nccl-tests, FlashInfer, ep_bench high-throughput before and since 2026-07-21) and DeepEP's and
HybridEP's NVL rules are in peer_rules.py, one function each beside its source; upstream_bytes holds them all.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import peer_rules
from .workload import Workload


@dataclass
class Traffic:
    pairs_SD: torch.Tensor      # int64 [W, W]
    slots_SD: torch.Tensor      # int64 [W, W]
    gpus_per_node: int
    node_pairs_S: torch.Tensor | None = None   # int64 [W]: (token, node) pairs each rank sends, own node included
    own_node_pairs_S: torch.Tensor | None = None   # int64 [W]: those of them to the sender's own node

    @property
    def world(self) -> int:
        return self.pairs_SD.shape[0]

    def per_rank(self) -> dict[str, torch.Tensor]:
        """Received counts per destination rank: total, remote, nvlink (same node), net, remote slots."""
        W = self.world
        node = torch.arange(W) // self.gpus_per_node
        same_node = node[:, None] == node[None, :]
        remote = ~torch.eye(W, dtype=torch.bool)
        return {
            "pairs": self.pairs_SD.sum(0),
            "remote_pairs": (self.pairs_SD * remote).sum(0),
            "nvlink_pairs": (self.pairs_SD * (remote & same_node)).sum(0),
            "net_pairs": (self.pairs_SD * ~same_node).sum(0),
            "remote_slots": (self.slots_SD * remote).sum(0),
        }


def count_pairs(topk_idx_TK: torch.Tensor, w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    """One source rank's row of pairs and slots, each int64 [W]. Masked (-1) slots go nowhere."""
    idx = topk_idx_TK.cpu()
    valid = idx >= 0
    dest = torch.where(valid, idx // w.local_experts, 0)
    onehot = torch.zeros(idx.shape[0], w.ep, dtype=torch.int64)
    onehot.scatter_add_(1, dest, valid.to(torch.int64))
    slots = onehot.sum(0)
    pairs = (onehot > 0).sum(0)
    return pairs, slots


def count_node_pairs(topk_idx_TK: torch.Tensor, w: Workload) -> int:
    """(token, node) pairs one rank sends, its own node included (DeepEP's num_rdma_token_sent)."""
    idx = topk_idx_TK.cpu()
    valid = idx >= 0
    node = torch.where(valid, idx // w.local_experts // w.gpus_per_node, -1)
    nodes = -(-w.ep // w.gpus_per_node)
    hit = torch.zeros(idx.shape[0], nodes + 1, dtype=torch.bool)
    hit[torch.arange(idx.shape[0])[:, None], node] = True       # column -1 (the last) collects masked slots
    return int(hit[:, :nodes].sum())


def count_own_node_pairs(topk_idx_TK: torch.Tensor, w: Workload, rank: int) -> int:
    """Tokens of `rank` with at least one expert on its own node: its (token, node) pairs that stay on the node."""
    idx = topk_idx_TK.cpu()
    own = (idx >= 0) & (idx // w.local_experts // w.gpus_per_node == rank // w.gpus_per_node)
    return int(own.any(dim=1).sum())


def traffic_of(routings: list[torch.Tensor], w: Workload) -> Traffic:
    """Traffic from every rank's topk_idx (index = source rank)."""
    rows = [count_pairs(idx, w) for idx in routings]
    nodes = torch.tensor([count_node_pairs(idx, w) for idx in routings], dtype=torch.int64)
    own = torch.tensor([count_own_node_pairs(idx, w, r) for r, idx in enumerate(routings)], dtype=torch.int64)
    return Traffic(torch.stack([p for p, _ in rows]), torch.stack([s for _, s in rows]), w.gpus_per_node, nodes, own)


def phase_bytes(t: Traffic, w: Workload, phase: str, dedup: bool) -> dict[str, float]:
    """Mean-over-ranks received bytes for a phase ('dispatch' carries w.dtype, 'combine' bf16)."""
    bpt = w.bytes_per_token if phase == "dispatch" else 2 * w.hidden
    c = {k: v.double().mean().item() for k, v in t.per_rank().items()}
    wire_rows = c["remote_pairs"] if dedup else c["remote_slots"]
    wire_extra = 0 if dedup or phase != "dispatch" else 4   # the alltoall path's second a2a carries fp32 probs
    return {
        "pairs": c["pairs"],
        "bytes": c["pairs"] * bpt,
        "bus_bytes": c["remote_pairs"] * bpt,
        "nvlink_bytes": c["nvlink_pairs"] * bpt,
        "net_bytes": c["net_pairs"] * bpt,
        "wire_bytes": wire_rows * (bpt + wire_extra),
    }


LL_FP8_SLOT_EXTRA = 16          # bytes of metadata per low-latency fp8 message (test_low_latency's "+ 16")


def deepep_ll(t: Traffic, w: Workload, phase: str) -> dict:
    """deepep_ll_bytes (module docstring): per routed (token, k) slot, fp8 dispatch messages, bf16 combine."""
    H = w.hidden
    per = (H + H // 128 * 4 + LL_FP8_SLOT_EXTRA) if phase == "dispatch" else 2 * H
    return {"deepep_ll_bytes": t.slots_SD.sum().item() / t.world * per}


def ncclep_ll(t: Traffic, w: Workload, phase: str) -> dict:
    """ncclep_ll_bytes (module docstring): (token, rank) messages on dispatch, valid selections x 2H on combine."""
    if phase == "dispatch":
        return {"ncclep_ll_bytes": t.pairs_SD.sum().item() / t.world * w.bytes_per_token}
    return {"ncclep_ll_bytes": t.slots_SD.sum().item() / t.world * 2 * w.hidden}


def deepep_v2_row_bytes(w: Workload, phase: str) -> int:
    """DeepEP V2's bytes per received (token, rank) row (tests/elastic/test_ep.py, count_bytes of what the call
    returns per row): dispatch = payload (+ fp8 scales) + top-k ids (int64) + weights (fp32); combine = the bf16 row
    + the top-k weights its combine carries back."""
    return w.bytes_per_token + 12 * w.topk if phase == "dispatch" else 2 * w.hidden + 4 * w.topk


def deepep_v2(t: Traffic, w: Workload, phase: str) -> dict:
    """deepep_v2_bytes (module docstring): received (token, rank) rows x payload + top-k ids and weights."""
    return {"deepep_v2_bytes": t.pairs_SD.sum().item() / t.world * deepep_v2_row_bytes(w, phase)}


def deepep_hybridep_rdma(t: Traffic, w: Workload, phase: str) -> dict:
    """deepep_rdma_bytes and hybridep_rdma_bytes (module docstring): (token, node) pairs, own node included; only
    when the ranks span more than one node."""
    if t.world <= t.gpus_per_node or t.node_pairs_S is None:
        return {}
    node_pairs = t.node_pairs_S.double().mean().item()
    return {"deepep_rdma_bytes": node_pairs * (w.bytes_per_token if phase == "dispatch" else 2 * w.hidden),
            "hybridep_rdma_bytes": node_pairs * w.bytes_per_token}


UPSTREAM_RULES = (deepep_ll, ncclep_ll, deepep_v2, deepep_hybridep_rdma, *peer_rules.RULES)


def upstream_bytes(t: Traffic, w: Workload, phase: str) -> dict[str, float]:
    """Mean-over-ranks bytes of a phase ('dispatch' or 'combine') by every upstream and peer rule (module docstring,
    peer_rules.py), each rule's keys beside the others'; the RDMA figures only when the ranks span more than one
    node."""
    out: dict[str, float] = {}
    for rule in UPSTREAM_RULES:
        out.update(rule(t, w, phase))
    return out


def bandwidth(b: dict[str, float], seconds: float) -> dict[str, float]:
    """GB/s (1e9 bytes) for each byte figure of phase_bytes()."""
    gb = 1e-9 / seconds if seconds > 0 else float("nan")
    return {
        "algbw_GBps": b["bytes"] * gb,
        "busbw_GBps": b["bus_bytes"] * gb,
        "nvlink_GBps": b["nvlink_bytes"] * gb,
        "net_GBps": b["net_bytes"] * gb,
        "wirebw_GBps": b["wire_bytes"] * gb,
    }
