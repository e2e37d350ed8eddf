"""The oracle: what dispatch and combine must return, computed from (seed, rank) alone.

The correctness expert multiplies every row by (global_expert_id + 1) and by the routing prob the row arrived
with (Megatron-Core's experts apply the probs; combine is an unweighted sum), so combine must give
    out[t] = sum_k w[t,k] * (e_k + 1) * x[t]      (masked slots contribute nothing)
which catches misrouting, lost or duplicated tokens and wrong weights (a combine that weighs again squares
them). Dispatch output is compared per local expert as a multiset of rows, bit for bit (backends may order
rows freely within an expert), and each row's prob against the routing's, to bf16 precision.
"""
from __future__ import annotations

import torch

from .workload import Workload, fp8_dequantize, rank_inputs


def expected_dispatch(w: Workload, rank: int, device="cpu", probs: bool = False):
    """Rows rank `rank` must receive: (rows per local expert [list of tensors], scales per expert or None), and with
    `probs` the routing prob of each of those rows (fp32, per expert) third.

    Within an expert, rows come in (source rank, token index) order, which is Megatron's order. Built on
    the host, where the inputs are drawn, and moved to `device` in one copy (no per-expert host syncs).
    """
    L = w.local_experts
    picks = []                                                           # (payload, scales, token ids, experts, probs)
    for src in range(w.ep):
        x, idx, wt, q, s = rank_inputs(w, src)
        local = idx - rank * L
        hit = (idx >= 0) & (local >= 0) & (local < L)
        rows = hit.nonzero(as_tuple=True)[0]
        onehot = torch.zeros(idx.shape[0], L, dtype=torch.bool)
        onehot[rows, local[hit]] = True                                  # a token routed twice to one expert: one row
        prob = torch.zeros(idx.shape[0], L, dtype=torch.float32)
        prob[rows, local[hit]] = wt[hit].float()
        t, j = onehot.nonzero(as_tuple=True)                             # by token, then expert
        picks.append((q if q is not None else x, s, t, j, prob[t, j]))
    j = torch.cat([p[3] for p in picks])
    order = j.argsort(stable=True)                                       # by expert, then source rank, then token
    at = torch.empty_like(order)
    at[order] = torch.arange(order.numel())                              # each pick's output row
    payload, scales = picks[0][0], picks[0][1]
    out = payload.new_empty(order.numel(), *payload.shape[1:])
    out_s = scales.new_empty(order.numel(), *scales.shape[1:]) if scales is not None else None
    o = 0
    raw = lambda a: a.view(torch.uint8)                                  # noqa: E731 - bytes: any dtype, fp8 too
    for p, sc, t, _, _ in picks:                                         # one copy of each row, straight to its place
        raw(out).index_copy_(0, at[o:o + t.numel()], raw(p).index_select(0, t))
        if out_s is not None:
            raw(out_s).index_copy_(0, at[o:o + t.numel()], raw(sc).index_select(0, t))
        o += t.numel()
    counts = torch.bincount(j, minlength=L).tolist()
    split = lambda a: list(a.to(device).split(counts)) if a is not None else None   # noqa: E731
    got = split(out), split(out_s)
    return (*got, split(torch.cat([p[4] for p in picks])[order])) if probs else got


def expert_factors(rank: int, w: Workload, device, dtype=torch.float32) -> torch.Tensor:
    """[L]: the correctness expert's factor (global_expert + 1) of each of rank `rank`'s local experts."""
    return torch.arange(rank * w.local_experts + 1, (rank + 1) * w.local_experts + 1, dtype=dtype, device=device)


def apply_experts(x_RH, tokens_per_expert, rank: int, w: Workload, scales_RS=None, probs_R=None) -> torch.Tensor:
    """y = dequant(x) * (global_expert + 1) [* prob of the row] in bf16 (fp32 math), row blocks per local expert."""
    xf = fp8_dequantize(x_RH, scales_RS[: x_RH.shape[0]]) if scales_RS is not None else x_RH.float()
    factor = torch.repeat_interleave(expert_factors(rank, w, x_RH.device),
                                     torch.tensor(counts(tokens_per_expert), device=x_RH.device),
                                     output_size=x_RH.shape[0])
    if probs_R is not None:
        factor = factor * probs_R[: x_RH.shape[0]].float()
    return (xf * factor[:, None]).to(torch.bfloat16)


def expected_combine(x_TH, topk_idx_TK, topk_w_TK, w: Workload, scales_TS=None) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * bf16(x[t] * (e_k + 1)), fp32 sum, bf16 result."""
    xf = fp8_dequantize(x_TH, scales_TS) if scales_TS is not None else x_TH.float()
    valid = topk_idx_TK >= 0
    factor = torch.where(valid, topk_idx_TK + 1, 0).float()          # [T, K]
    y = (xf[:, None, :] * factor[..., None]).to(torch.bfloat16).float()   # [T, K, H]
    return (y * (topk_w_TK * valid)[..., None]).sum(1).to(torch.bfloat16)


_MIX = 0x9E3779B97F4A7C15 - 2**64     # an odd 64-bit constant as a signed int64


def _words(t: torch.Tensor) -> torch.Tensor:
    """Rows [N, ...] as the int64 values of their 32-bit words (of their bytes where the width is no
    multiple of 4), whatever the dtype."""
    b = t.reshape(t.shape[0], -1).contiguous().view(torch.uint8)
    return b.view(torch.int32).to(torch.int64) if b.shape[1] % 4 == 0 else b.to(torch.int64)


def _row_hashes(x: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """A 64-bit hash of each row's bytes and its scales' bytes: a random linear form over the rows' words
    (coefficients below 2^31, words below 2^32 in size), so that two different rows collide with probability
    about 2^-31."""
    g = torch.Generator().manual_seed(11)
    h = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    for part in (x, scales) if scales is not None else (x,):
        w = _words(part)
        coef = torch.randint(1, 2**31 - 1, (w.shape[1],), generator=g, dtype=torch.int64)
        h = h * _MIX + (w * coef.to(w.device)).sum(1)
    return h


def _row_bytes(rows: list[torch.Tensor], scales) -> tuple:
    """The byte width of a row and of its scales (None without scales)."""
    width = lambda t: t.shape[1:].numel() * t.element_size()  # noqa: E731
    return width(rows[0]), (width(scales[0]) if scales is not None else None)


def _tally(got_rows: list[torch.Tensor], got_scales, exp_rows, exp_scales):
    """(rows wrong per local expert [L], the keys of the received and of the expected rows, or None when
    there is nothing to key): a row's key is its hash plus its expert times an odd constant; per expert,
    the received keys that are not expected (corrupted, misrouted, extra) or the expected ones that are
    missing, whichever is more. One pass over every expert's rows and one host sync."""
    L = len(exp_rows)
    n_got, n_exp = [g.shape[0] for g in got_rows], [e.shape[0] for e in exp_rows]
    if _row_bytes(got_rows, got_scales) != _row_bytes(exp_rows, exp_scales):   # rows of another width: all wrong
        return [max(g, e) for g, e in zip(n_got, n_exp)], None
    if not sum(n_got) + sum(n_exp):
        return [0] * L, None
    dev = got_rows[0].device
    expert = torch.repeat_interleave(torch.arange(L, device=dev).repeat(2), torch.tensor(n_got + n_exp, device=dev))
    keys = torch.cat([_row_hashes(torch.cat(got_rows), torch.cat(got_scales) if got_scales is not None else None),
                      _row_hashes(torch.cat(exp_rows).to(dev),
                                  torch.cat(exp_scales).to(dev) if exp_scales is not None else None)]) + expert * _MIX
    sign = torch.cat([torch.ones(sum(n_got), dtype=torch.int64, device=dev),
                      -torch.ones(sum(n_exp), dtype=torch.int64, device=dev)])
    _, inv = torch.unique(keys, return_inverse=True)
    net = torch.zeros(int(inv.numel()), dtype=torch.int64, device=dev).scatter_add_(0, inv, sign)
    owner = torch.zeros_like(net).scatter_(0, inv, expert)               # the expert of each distinct key
    extra = torch.zeros(L, dtype=torch.int64, device=dev).scatter_add_(0, owner, net.clamp(min=0))
    missing = torch.zeros(L, dtype=torch.int64, device=dev).scatter_add_(0, owner, (-net).clamp(min=0))
    return torch.maximum(extra, missing).tolist(), (keys[:sum(n_got)], keys[sum(n_got):])


def _raw(rows: list[torch.Tensor], scales) -> torch.Tensor:
    """Every row's bytes and its scales' bytes, one row each."""
    b = torch.cat(rows).flatten(1).view(torch.uint8)
    return torch.cat([b, torch.cat(scales).flatten(1).contiguous().view(torch.uint8)], 1) if scales is not None else b


PROB_RTOL = 4e-3       # a prob carried in bf16 differs by at most 2^-9 relative; a wrong slot's prob by far more


def check_dispatch(got_rows: list[torch.Tensor], got_scales, exp_rows, exp_scales, rank: int, w: Workload,
                   got_probs=None, exp_probs=None) -> str:
    """'' when each local expert received exactly the expected multiset of rows, bit for bit (and, where both
    `got_probs` and `exp_probs` are given, each row the prob of its (token, expert) to bf16 precision); else the
    first difference."""
    for j, (g, e) in enumerate(zip(got_rows, exp_rows)):
        if g.shape[0] != e.shape[0]:
            return f"rank {rank} expert {rank * w.local_experts + j}: received {g.shape[0]} rows, expected {e.shape[0]}"
    bad, keys = _tally(got_rows, got_scales, exp_rows, exp_scales)
    wrong = next((j for j, n in enumerate(bad) if n), None)
    differ = "received rows differ from the expected tokens (misrouted or corrupted payload)"
    if wrong is not None:
        return f"rank {rank} expert {rank * w.local_experts + wrong}: {differ}"
    if keys is None:
        return ""
    gk, ek = keys                               # the keys agree: confirm byte for byte, rows in key order
    dev = gk.device
    go, eo = gk.argsort(stable=True), ek.argsort(stable=True)
    exp = _raw([e.to(dev) for e in exp_rows], [s.to(dev) for s in exp_scales] if exp_scales is not None else None)
    if not torch.equal(_raw(got_rows, got_scales)[go], exp[eo]):
        return f"rank {rank}: {differ}"
    if got_probs is None or exp_probs is None:
        return ""
    gp, ep = torch.cat(got_probs).float()[go], torch.cat(exp_probs).to(dev).float()[eo]
    off = (gp - ep).abs() > PROB_RTOL * ep.abs()
    if not off.any():
        return ""
    i = int(off.nonzero()[0, 0])
    return (f"rank {rank}: a received row carries the prob {gp[i].item():.6g}, its routing gives {ep[i].item():.6g} "
            f"({int(off.sum())} of {off.numel()} rows)")


def counts(tokens_per_expert) -> list[int]:
    """Rows per local expert as a host list, from a host list or a device tensor (one host sync)."""
    if isinstance(tokens_per_expert, torch.Tensor):
        return [int(c) for c in tokens_per_expert.tolist()]
    return [int(c) for c in tokens_per_expert]


def split_rows(x_RH, tokens_per_expert) -> list[torch.Tensor]:
    """Row blocks per local expert; a trailing remainder (padding) is ignored."""
    n = counts(tokens_per_expert)
    return list(torch.split(x_RH[: sum(n)], n))


def check_combine(out_TH: torch.Tensor, expected_TH: torch.Tensor, rel_tol: float = 1e-2) -> str:
    """Per-token relative L2 error; bf16 rounding gives ~3e-3, a lost or misrouted slot ~1e-1."""
    if out_TH.shape != expected_TH.shape:
        return f"combine returned shape {tuple(out_TH.shape)}, expected {tuple(expected_TH.shape)}"
    g, e = out_TH.float(), expected_TH.to(out_TH.device).float()
    if g.shape[0] == 0:
        return ""
    err = (g - e).norm(dim=1) / e.norm(dim=1).clamp(min=1e-6)
    worst = err.argmax()
    finite, worst, worst_err = torch.stack([torch.isfinite(g).all().double(), worst.double(),  # one host sync
                                            err[worst].double()]).tolist()
    if not finite:
        return "combine returned non-finite values"
    if worst_err > rel_tol:
        return f"combine token {int(worst)}: relative error {worst_err:.3g} > {rel_tol:g}"
    return ""


def dispatch_bad_rows(got_rows: list[torch.Tensor], got_scales, exp_rows, exp_scales, rank: int,
                      w: Workload) -> list[tuple[int, int]]:
    """[(global expert, rows wrong)] for the local experts whose received rows are not the expected multiset
    (by hash: a wrong row passes with probability about 2^-31); [] when all are right. What a soak counts
    (a single check stops at the first difference and confirms a pass byte for byte: check_dispatch)."""
    bad, _ = _tally(got_rows, got_scales, exp_rows, exp_scales)
    return [(rank * w.local_experts + j, n) for j, n in enumerate(bad) if n]


def combine_bad_tokens(out_TH: torch.Tensor, expected_TH: torch.Tensor, rel_tol: float = 1e-2) -> list[int]:
    """The tokens whose combined row is wrong (relative L2 error above rel_tol, or not finite)."""
    if out_TH.shape != expected_TH.shape:
        return list(range(expected_TH.shape[0]))
    g, e = out_TH.float(), expected_TH.to(out_TH.device).float()
    err = (g - e).norm(dim=1) / e.norm(dim=1).clamp(min=1e-6)
    return torch.nonzero(~(err <= rel_tol)).flatten().tolist()
