"""SHA-256 of the inputs a backend was given, so a comparison can prove its arms ran on the same tokens and routes.

AWS's fair EP comparison (awslabs/awsome-distributed-ai, micro-benchmarks/expert-parallelism/ep-backend-comparison,
fair_ep_benchmark.py, PR #1238) matches every arm's inputs and routes by SHA-256 before it compares them. Here each
rank hashes its own tensors as the backend receives them (bytes in memory order, dtype and shape included, so a
bf16 and an fp8 payload of the same bits differ), and a run's digest is the SHA-256 of every rank's hex digest in
rank order: two runs share it exactly when every rank was given the same bytes.
"""
from __future__ import annotations

import hashlib

import torch

KINDS = ("routing", "payload")      # routing: top-k ids and weights; payload: the tokens (and fp8 scales)


def rank_digest(*tensors: torch.Tensor | None) -> str:
    """The SHA-256 (hex) of the tensors' dtypes, shapes and bytes, in order; None entries are skipped."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            continue
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())        # read in place: no copy of a large payload
    return h.hexdigest()


def run_digest(per_rank: list[str]) -> str:
    """The run's digest: SHA-256 of every rank's hex digest, in rank order."""
    return hashlib.sha256("".join(per_rank).encode()).hexdigest()


def inputs(topk_idx_TK, topk_w_TK, payload_TH, scales_TS=None) -> dict[str, str]:
    """{routing, payload}: this rank's digests of what a backend is given."""
    return {"routing": rank_digest(topk_idx_TK, topk_w_TK), "payload": rank_digest(payload_TH, scales_TS)}


def combine(per_rank: list[dict[str, str]]) -> dict[str, str]:
    """{routing, payload} of a run from every rank's `inputs` (rank order)."""
    return {k: run_digest([r[k] for r in per_rank]) for k in KINDS}
