"""The byte rules of the harnesses users quote, one function each, read from each peer's source (cited in the
function's docstring: repository, commit, file, lines), so that every record carries each peer's byte count
(`traffic.upstream`, traffic.upstream_bytes) and `report --as PEER` can set a row beside a published one.

Every function takes the run's Traffic (traffic.py: pairs_SD / slots_SD, every rank's (token, destination rank)
pairs and (token, k) slots, and node_pairs_S) and Workload, and a phase ('dispatch' carries the run's dtype,
'combine' bf16), and returns {key: mean-over-ranks bytes of that phase}; a figure that exists only across
nodes is left out on one node. Rules differ in three ways (README.md, "Published tables"): what one copy is
((token, rank) pair, (token, node) pair or (token, expert) slot), whether the sender's own rank counts, and what
a copy carries (payload, fp8 scales, top-k metadata). A peer whose time is an aggregate over ranks (FlashInfer)
is still stored per rank here; report multiplies where the peer does.

Shape legend: S source rank, D destination rank (both W ranks).
"""
from __future__ import annotations

import torch

from .workload import FP8_BLOCK, Workload


def _bf16(w: Workload) -> int:
    return 2 * w.hidden


def _row_bytes(w: Workload, phase: str) -> int:
    """A token's payload on the wire in this phase: the run's dtype on dispatch (fp8: e4m3 + fp32 scale per 128),
    bf16 on combine."""
    return w.bytes_per_token if phase == "dispatch" else _bf16(w)


def _off_node_SD(t) -> torch.Tensor:
    """[W, W] True where source and destination ranks sit on different nodes (gpus_per_node ranks a node)."""
    node = torch.arange(t.world) // t.gpus_per_node
    return node[:, None] != node[None, :]


def _mean(x_SD: torch.Tensor, t) -> float:
    """A [W, W] count summed and divided by the ranks: the mean per rank (sent or received: the same sum)."""
    return x_SD.sum().item() / t.world


def _spans_nodes(t) -> bool:
    return t.world > t.gpus_per_node


def collectivex(t, w: Workload, phase: str) -> dict:
    """CollectiveX (SemiAnalysisAI/InferenceX@843c625, experimental/CollectiveX): `logical_byte_provenance`
    (bench/ep_harness.py L82-106) x `routed_copies` (bench/routing.py L130-167: unique (token, destination rank)
    pairs of the global batch, self included): per pair hidden x value bytes (bf16 2, fp8 1) + per-128-block fp32
    scales on an fp8 dispatch (DeepEP V2's codec; MoRI's plain cast carries none), no metadata, no padding; combine
    always bf16 (ep_harness.py L1341-1345). Its GB/s per GPU divides the global bytes by EP (bandwidth.py
    `_algbw_per_gpu`): the mean per rank here. Low-latency kernels that send one copy per (token, expert) are
    flagged (`logical_copies.wire` = per-assignment), not recounted."""
    value_bytes = 2 if (phase == "combine" or w.dtype == "bf16") else 1
    scales = 4 * (w.hidden // FP8_BLOCK) if (phase == "dispatch" and w.dtype == "fp8") else 0
    return {"collectivex_bytes": _mean(t.pairs_SD, t) * (w.hidden * value_bytes + scales)}


def aws_fair(t, w: Workload, phase: str) -> dict:
    """AWS's common-boundary harness (awslabs/awsome-distributed-ai@137f849, micro-benchmarks/expert-parallelism/
    ep-backend-comparison/fair_ep_benchmark.py, `logical_payload_bytes_per_rank`): one copy per valid
    (token, expert) selection, each carrying the dispatch tensor (bf16 2H; fp8 H + ceil(H/128) x 4) plus one bf16
    combine tensor, metadata excluded; scale-out bytes: the selections whose expert sits on another node than
    the sender. Its figure is per round trip (dispatch + combine under one event pair, `run_dtype`), so a phase here
    holds its own half: the dispatch tensor on dispatch, the bf16 tensor on combine; report adds them."""
    per = w.hidden + -(-w.hidden // FP8_BLOCK) * 4 if (phase == "dispatch" and w.dtype == "fp8") else _bf16(w)
    return {"aws_fair_bytes": _mean(t.slots_SD, t) * per,
            "aws_fair_scaleout_bytes": _mean(t.slots_SD * _off_node_SD(t), t) * per}


def nccl_tests_alltoall(t, w: Workload, phase: str) -> dict:
    """nccl-tests' alltoall_perf (NVIDIA/nccl-tests@a0b82b2, src/alltoall.cu L48-54 `AlltoAllGetBw`, with the
    count of src/common.cu L907 and L796): algbw = count x nranks x typesize / t, the bytes one rank sends, its own
    chunk included; busbw = algbw x (n - 1) / n, as if 1/n of every send stayed local. For an EP phase the send is
    the (token, destination rank) rows of an alltoallv (mean per rank, self included: moebench's algbw bytes); the
    busbw factor is nccl-tests' uniform (n - 1) / n, not the run's real local share (moebench's busbw)."""
    size = _mean(t.pairs_SD, t) * _row_bytes(w, phase)
    return {"nccl_tests_alltoall_bytes": size, "nccl_tests_alltoall_bus_bytes": size * (t.world - 1) / t.world}


def flashinfer(t, w: Workload, phase: str) -> dict:
    """FlashInfer's moe_a2a_dispatch_combine (flashinfer-ai/flashinfer@5e07b58, benchmarks/routines/moe_comm.py
    `_calculate_exact_comm_traffic`): for every token and every *remote* destination rank once (the source's own
    rank excluded), dispatch = hidden payload + scales + 8 bytes (int32 expert id + fp32 weight) per expert the
    token selects on that rank; combine = hidden x 2 per such pair. Payload: bf16 2H; its `fp8` recipe is
    per-tensor (H, no scales); moebench's fp8 (per-128 fp32 scales) is its `fp8_block_scale` recipe, which that
    function counts at the input dtype's 2 bytes per value (its else branch): followed as written. It sums every
    rank's routing and prints aggregate TB/s (bytes of all ranks / time); stored per rank here. An older version of
    the same file (06686f7) had no exact count: T x (payload + 8 B x K) x (n - 1) / n, a uniform estimate; tables
    printed by it are not this rule."""
    remote_SD = ~torch.eye(t.world, dtype=torch.bool)
    pairs, slots = _mean(t.pairs_SD * remote_SD, t), _mean(t.slots_SD * remote_SD, t)
    if phase == "combine":
        return {"flashinfer_bytes": pairs * _bf16(w)}
    return {"flashinfer_bytes": pairs * _bf16(w) + slots * (4 + 4)}


def ep_bench_ht(t, w: Workload, phase: str) -> dict:
    """NCCL EP's ep_bench, high-throughput, since NVIDIA/nccl-extensions 9684eda (2026-07-21; unchanged at
    44d2de0): nccl_ep/ep_bench.cu `calculateHighThroughputBytes` (L2931-3016 at 9684eda): send = unique (token,
    target rank) pairs, own rank included, rdma_send those on another node (LSA team = node); recv = (source rank,
    token) pairs, own rank included; x bytes per token (bf16 2H; scales-forward fp8 H + scales x 4, with its scale
    block set to 128 as this run's fp8 carries, its synthetic default being 4 scales). Per-rank averages; combine
    prints the same figures with send and recv swapped (`printHighThroughputResults`, L3282-3292), so both phases
    carry the dispatch payload's bytes. Mean send = mean recv: one figure."""
    out = {"ep_bench_ht_bytes": _mean(t.pairs_SD, t) * w.bytes_per_token}
    if _spans_nodes(t):
        out["ep_bench_ht_rdma_bytes"] = _mean(t.pairs_SD * _off_node_SD(t), t) * w.bytes_per_token
    return out


def ep_bench_ht_before_0721(t, w: Workload, phase: str) -> dict:
    """ep_bench high-throughput before nccl-extensions 9684eda (at 9684eda^ = 2c6135a, ep_bench.cu L2925-2960):
    send = unique (token, target node) pairs, own node included (the TODO the 2026-07-21 change resolved: a token to
    several ranks of one node counted once), rdma_send the pairs to other nodes; recv as since. Only the send
    figures differ; tables published before 2026-07-21 divide these."""
    if t.node_pairs_S is None:
        return {}
    out = {"ep_bench_ht_send_before_0721_bytes": t.node_pairs_S.double().mean().item() * w.bytes_per_token}
    if _spans_nodes(t) and t.own_node_pairs_S is not None:
        remote = (t.node_pairs_S - t.own_node_pairs_S).double().mean().item()
        out["ep_bench_ht_rdma_send_before_0721_bytes"] = remote * w.bytes_per_token
    return out


def deepep_nvl(t, w: Workload, phase: str) -> dict:
    """DeepEP V1's test_intranode (deepseek-ai/DeepEP@dd758ca, tests/legacy/test_intranode.py L188-201):
    dispatch_bf16_nvl_recv_bytes = recv_x.numel() x 2 (received (token, rank) rows, own rank included), x (1 + 4/128)
    / 2 for fp8; combine_bf16_nvl_send_bytes = the bf16 dispatch figure. This is moebench's algbw numerator (the
    runner asserts it per rank against the real call, backends/deepep.py native_bytes)."""
    return {"deepep_nvl_bytes": _mean(t.pairs_SD, t) * _row_bytes(w, phase)}


def hybridep_nvl(t, w: Workload, phase: str) -> dict:
    """HybridEP's test_hybrid_ep (deepseek-ai/DeepEP@94a9f8f, branch hybrid-ep, tests/test_hybrid_ep.py L344-347):
    nvl_dispatch = dispatched_hidden.numel() x 2 (x (1 + 4/128) / 2 for fp8), nvl_combine = the bf16 figure (its RDMA
    combine, traffic.deepep_hybridep_rdma, keeps the fp8 factor instead)."""
    return {"hybridep_nvl_bytes": _mean(t.pairs_SD, t) * _row_bytes(w, phase)}


RULES = (deepep_nvl, hybridep_nvl, collectivex, aws_fair, nccl_tests_alltoall, flashinfer, ep_bench_ht,
         ep_bench_ht_before_0721)
