"""Torch implementation of the permute ops: the oracle, and the CPU implementation.

Legend: T tokens, H hidden, K top-k, E experts, R permuted rows, S scale columns, C chunks.

Order (Megatron-Core ``moe_utils.permute``, unfused): rows grouped by expert; inside an expert,
by token index; slots with expert -1 are skipped. For the rare (token, expert) pair that appears
twice in one token's top-k, the two rows keep k order. With ``pad_multiple=m > 0`` each expert's
block of rows starts at a multiple of m and is zero-filled up to the next multiple.
"""
from __future__ import annotations

import torch
from torch import Tensor


def round_up(n: Tensor, m: int) -> Tensor:
    return (n + (m - 1)) // m * m if m > 0 else n


def route(topk_idx_TK: Tensor, num_experts: int, pad_multiple: int = 0):
    """Index math only. Returns (row_map_TK int32, tokens_per_expert_E int32, num_rows int,
    slots_R int64 (flat slot t*K+k of each valid row, in row order), rows_R int64)."""
    T, K = topk_idx_TK.shape
    flat = topk_idx_TK.reshape(-1).long()
    valid = flat >= 0
    slots = torch.nonzero(valid).reshape(-1)
    experts = flat[slots]
    order = torch.sort(experts, stable=True).indices
    slots, experts = slots[order], experts[order]
    counts = torch.bincount(experts, minlength=num_experts)[:num_experts]
    padded = round_up(counts, pad_multiple)
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    pos = torch.arange(slots.numel(), device=flat.device)
    rows = starts[experts] + (pos - first[experts])
    row_map = torch.full((T * K,), -1, dtype=torch.int32, device=flat.device)
    row_map[slots] = rows.to(torch.int32)
    num_rows = int(padded.sum())
    return row_map.view(T, K), padded.to(torch.int32), num_rows, slots, rows


def permute(x_TH: Tensor, topk_idx_TK: Tensor, num_experts: int, scales_TS: Tensor | None = None,
            pad_multiple: int = 0, num_out_rows: int = -1, variant: str = "", probs_TK: Tensor | None = None):
    """Returns (x_RH, scales_RS or None, row_map_TK, tokens_per_expert_E, probs_R or None);
    num_out_rows and variant unused. probs_R[row_map[t, k]] = probs_TK[t, k]; padding rows 0."""
    K = topk_idx_TK.shape[1]
    row_map, tpe, R, slots, rows = route(topk_idx_TK, num_experts, pad_multiple)
    tokens = slots // K
    out = x_TH.new_zeros((R, x_TH.shape[1]))
    out[rows] = x_TH[tokens]
    out_s = None
    if scales_TS is not None:
        out_s = scales_TS.new_zeros((R, scales_TS.shape[1]))
        out_s[rows] = scales_TS[tokens]
    out_p = None
    if probs_TK is not None:
        out_p = torch.zeros(R, dtype=torch.float32, device=x_TH.device)
        out_p[rows] = probs_TK.reshape(-1)[slots].float()
    return out, out_s, row_map, tpe, out_p


def unpermute(y_RH: Tensor, row_map_TK: Tensor, topk_w_TK: Tensor) -> Tensor:
    """out[t] = sum_k w[t,k] * y[row_map[t,k]] over row_map >= 0; fp32 accumulation in k order."""
    T, K = row_map_TK.shape
    acc = torch.zeros((T, y_RH.shape[1]), dtype=torch.float32, device=y_RH.device)
    for k in range(K):
        r = row_map_TK[:, k].long()
        ok = r >= 0
        w = torch.where(ok, topk_w_TK[:, k].float(), 0.0)
        if y_RH.shape[0] == 0:
            continue
        acc += w[:, None] * y_RH[r.clamp(min=0)].float() * ok[:, None]
    return acc.to(y_RH.dtype)


def sort_chunks_by_idxs(x_RH: Tensor, split_sizes_C: Tensor, sorted_idxs_C: Tensor) -> Tensor:
    """Megatron semantics: split rows into chunks of split_sizes, concatenate in sorted_idxs order."""
    chunks = torch.split(x_RH, split_sizes_C.tolist(), dim=0)
    parts = [chunks[i] for i in sorted_idxs_C.tolist()]
    return torch.cat(parts, dim=0) if parts else x_RH[:0].clone()
