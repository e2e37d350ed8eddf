"""The oracle: what dispatch and combine must return, computed from (seed, rank) alone.

The correctness expert multiplies every row by (global_expert_id + 1), so combine must give
    out[t] = sum_k w[t,k] * (e_k + 1) * x[t]      (masked slots contribute nothing)
which catches misrouting, lost or duplicated tokens and wrong weights. Dispatch output is
compared per local expert as a multiset of rows, bit for bit (backends may order rows freely
within an expert).
"""
from __future__ import annotations

import torch

from .workload import Workload, fp8_dequantize, rank_inputs


def expected_dispatch(w: Workload, rank: int, device="cpu"):
    """Rows rank `rank` must receive: (rows per local expert [list of tensors], scales per expert or None).

    Within an expert, rows come in (source rank, token index) order, which is Megatron's order.
    """
    L = w.local_experts
    rows: list[list[torch.Tensor]] = [[] for _ in range(L)]
    scales: list[list[torch.Tensor]] = [[] for _ in range(L)]
    for src in range(w.ep):
        x, idx, _, q, s = rank_inputs(w, src, device)
        local = idx - rank * L
        hit = (idx >= 0) & (local >= 0) & (local < L)
        onehot = torch.zeros(idx.shape[0], L, dtype=torch.int32, device=idx.device)
        onehot.scatter_add_(1, torch.where(hit, local, 0), hit.to(torch.int32))
        payload = q if q is not None else x
        for j in range(L):
            take = onehot[:, j] > 0
            rows[j].append(payload[take])
            if s is not None:
                scales[j].append(s[take])
    out_rows = [torch.cat(r) for r in rows]
    out_scales = [torch.cat(s) for s in scales] if w.dtype == "fp8" else None
    return out_rows, out_scales


def expert_factors(rank: int, w: Workload, device, dtype=torch.float32) -> torch.Tensor:
    """[L]: the correctness expert's factor (global_expert + 1) of each of rank `rank`'s local experts."""
    return torch.arange(rank * w.local_experts + 1, (rank + 1) * w.local_experts + 1, dtype=dtype, device=device)


def apply_experts(x_RH, tokens_per_expert, rank: int, w: Workload, scales_RS=None) -> torch.Tensor:
    """y = dequant(x) * (global_expert + 1) in bf16, row blocks per local expert."""
    xf = fp8_dequantize(x_RH, scales_RS) if scales_RS is not None else x_RH.float()
    factor = torch.repeat_interleave(expert_factors(rank, w, x_RH.device),
                                     torch.as_tensor(list(tokens_per_expert), device=x_RH.device),
                                     output_size=x_RH.shape[0])
    return (xf * factor[:, None]).to(torch.bfloat16)


def expected_combine(x_TH, topk_idx_TK, topk_w_TK, w: Workload, scales_TS=None) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * bf16(x[t] * (e_k + 1)), fp32 sum, bf16 result."""
    xf = fp8_dequantize(x_TH, scales_TS) if scales_TS is not None else x_TH.float()
    valid = topk_idx_TK >= 0
    factor = torch.where(valid, topk_idx_TK + 1, 0).float()          # [T, K]
    y = (xf[:, None, :] * factor[..., None]).to(torch.bfloat16).float()   # [T, K, H]
    return (y * (topk_w_TK * valid)[..., None]).sum(1).to(torch.bfloat16)


def _row_keys(x: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """Rows as int32 words so that comparison is bitwise whatever the payload dtype."""
    key = x.view(torch.int16).to(torch.int32) if x.element_size() == 2 else x.view(torch.uint8).to(torch.int32)
    if scales is not None:
        key = torch.cat([key, scales.contiguous().view(torch.int32)], dim=1)
    return key


def _sorted_rows(key: torch.Tensor) -> torch.Tensor:
    coef = torch.randint(1, 2**31 - 1, (key.shape[1],), generator=torch.Generator().manual_seed(7))
    h = (key.to(torch.int64) * coef.to(key.device)).sum(1)
    return key[h.argsort(stable=True)]


def check_dispatch(got_rows: list[torch.Tensor], got_scales, exp_rows, exp_scales, rank: int, w: Workload) -> str:
    """'' when each local expert received exactly the expected multiset of rows; else the first difference."""
    for j, (g, e) in enumerate(zip(got_rows, exp_rows)):
        ge = f"rank {rank} expert {rank * w.local_experts + j}"
        if g.shape[0] != e.shape[0]:
            return f"{ge}: received {g.shape[0]} rows, expected {e.shape[0]}"
        if g.shape[0] == 0:
            continue
        gk = _row_keys(g, got_scales[j] if got_scales is not None else None)
        ek = _row_keys(e.to(g.device), exp_scales[j].to(g.device) if exp_scales is not None else None)
        if not torch.equal(_sorted_rows(gk), _sorted_rows(ek)):
            return f"{ge}: received rows differ from the expected tokens (misrouted or corrupted payload)"
    return ""


def split_rows(x_RH, tokens_per_expert) -> list[torch.Tensor]:
    """Row blocks per local expert; a trailing remainder (padding) is ignored."""
    counts = [int(c) for c in tokens_per_expert]
    return list(torch.split(x_RH[: sum(counts)], counts))


def check_combine(out_TH: torch.Tensor, expected_TH: torch.Tensor, rel_tol: float = 1e-2) -> str:
    """Per-token relative L2 error; bf16 rounding gives ~3e-3, a lost or misrouted slot ~1e-1."""
    if out_TH.shape != expected_TH.shape:
        return f"combine returned shape {tuple(out_TH.shape)}, expected {tuple(expected_TH.shape)}"
    g, e = out_TH.float(), expected_TH.to(out_TH.device).float()
    if not torch.isfinite(g).all():
        return "combine returned non-finite values"
    err = (g - e).norm(dim=1) / e.norm(dim=1).clamp(min=1e-6)
    worst = int(err.argmax())
    if err[worst] > rel_tol:
        return f"combine token {worst}: relative error {err[worst]:.3g} > {rel_tol:g}"
    return ""


def _row_hashes(key: torch.Tensor) -> torch.Tensor:
    coef = torch.randint(1, 2**31 - 1, (key.shape[1],), generator=torch.Generator().manual_seed(11))
    return (key.to(torch.int64) * coef.to(key.device)).sum(1)


def dispatch_bad_rows(got_rows: list[torch.Tensor], got_scales, exp_rows, exp_scales, rank: int,
                      w: Workload) -> list[tuple[int, int]]:
    """[(global expert, rows wrong)] for the local experts whose received rows are not the expected multiset:
    rows that are not among the expected ones (corrupted, misrouted or extra), or missing rows; [] when all are
    right. What a soak counts (a single check stops at the first difference: check_dispatch)."""
    out = []
    for j, (g, e) in enumerate(zip(got_rows, exp_rows)):
        if g.shape[0] == 0 and e.shape[0] == 0:
            continue
        gk = _row_keys(g, got_scales[j] if got_scales is not None else None) if g.shape[0] else None
        ek = _row_keys(e.to(g.device), exp_scales[j].to(g.device) if exp_scales is not None else None)
        if gk is None or gk.shape[1] != ek.shape[1]:
            bad = max(g.shape[0], e.shape[0])
        else:
            h = torch.cat([_row_hashes(gk), _row_hashes(ek)])
            sign = torch.cat([torch.ones(len(gk), dtype=torch.int64, device=h.device),
                              -torch.ones(len(ek), dtype=torch.int64, device=h.device)])
            _, inv = torch.unique(h, return_inverse=True)
            net = torch.zeros(int(inv.max()) + 1, dtype=torch.int64, device=h.device).scatter_add_(0, inv, sign)
            bad = int(max(net.clamp(min=0).sum(), (-net).clamp(min=0).sum()))
        if bad:
            out.append((rank * w.local_experts + j, bad))
    return out


def combine_bad_tokens(out_TH: torch.Tensor, expected_TH: torch.Tensor, rel_tol: float = 1e-2) -> list[int]:
    """The tokens whose combined row is wrong (relative L2 error above rel_tol, or not finite)."""
    if out_TH.shape != expected_TH.shape:
        return list(range(expected_TH.shape[0]))
    g, e = out_TH.float(), expected_TH.to(out_TH.device).float()
    err = (g - e).norm(dim=1) / e.norm(dim=1).clamp(min=1e-6)
    return torch.nonzero(~(err <= rel_tol)).flatten().tolist()
