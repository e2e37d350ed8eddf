"""HIGH_THROUGHPUT EXPERT_MAJOR dispatch and combine (header `nccl_ep.h:836-876`; ext `nccl_ep.cc:3600-4140`,
`:4530-4720`), in the library's default path for ranks of one node without zero copy (kLocalPermute, `:1933-1953`),
and with it (GroupConfig.zero_copy ON: dispatch's outputs and combine's input must be NCCL windows; the rows are the
same, docs/zero-copy.md).

dispatch writes one row per (source token, local expert) from row 0, grouped by local expert, then source rank, then
token (the handle's rows, handle.py); padding rows inside an expert's zone are zero; rows past the total are left as
the caller's buffer held them (the fake fills them with garbage: NaN, 0x7F bytes for fp8, so a reader of them shows).
outputs.topk_weights is 1-D, that row's routing weight. The outputs must cover, in rows: eager mode (budget 0) the
routing's total (recv_total_counter, `:3886-3898`), a fixed budget the whole budget (`:3735-3737`, `:3899-3906`,
`:4108`). combine sums each token's rows back (the caller applied the weights, wheel `enums.py:57-63`) in fp32, from
rows [0, total) of its input, which must hold them (the kernel's slot backstop, device `ht_ep.cuh:5370-5374`).
NCCL EP stages every dispatch and combine row in a slot of max_token_bytes (`:1037-1068`): dispatch checks its rows
(`:3614-3616`, and token + scale bytes under FWD in recipes.py); combine does not check its rows (bf16, 2 x H bytes)
and would write past its staging: the fake refuses such a combine (failures.overrun).
"""
from __future__ import annotations

import torch
from gloo_bytes import garbage, gather, u8

from . import failures as f
from .failures import COMBINE
from .libnccl import window_of
from .recipes import FWD

ZERO_COPY_ON = 2            # ncclEpZeroCopyMode_t NCCL_EP_ZERO_COPY_ON


def windowed(d) -> bool:
    """The descriptor is backed by a live NCCL window that covers its bytes."""
    if not d.win:
        return False
    w = window_of(d.win)
    return w.ptr <= d.data and d.data + d.row_bytes * (d.sizes[0] if d.sizes else 0) <= w.ptr + w.size


def require_windows(g, descs, call: str) -> None:
    """zero_copy ON: HT dispatch's token (and FWD scale) outputs and combine's token input must be windows; a plain
    tensor there is ncclInvalidArgument (docs/zero-copy.md "Under ON")."""
    if g.config["zero_copy"] != ZERO_COPY_ON:
        return
    for d, what in descs:
        if d is not None and not windowed(d):
            f.invalid(f.INVALID_ARGUMENT, f"NCCL EP: zero_copy ON requires a window-backed {what} ({call})")


def dispatch(h, c) -> None:
    g, x, em, mtb = h.group, c.x, h.em, h.group.config["max_token_bytes"]
    f.c_assert(x.sizes[0] == h.num_tokens, 3612, "x->sizes[0] == handle->num_tokens")
    f.c_assert(x.sizes[0] <= g.max_tokens, 3613, "x->sizes[0] <= group->config.max_dispatch_tokens_per_rank")
    f.c_assert(x.row_bytes <= mtb, 3615, 'x->sizes[1] * ncclTypeSize(x->datatype) <= group->config.max_token_bytes '
               '&& "HT dispatch token bytes must not exceed group\'s max_token_bytes"')
    f.c_assert(g.local_experts * g.nranks * 4 % 16 == 0, 3670, '(experts_per_lsa_team * static_cast<int>(sizeof('
               'float))) % 16 == 0 && "HT dispatch requires experts_per_lsa_team to be multiple of 4 (16B prob TMA '
               'alignment)"')
    f.c_assert(x.row_bytes % 16 == 0, 3674, '(token_bytes % 16) == 0 && "HT dispatch requires token bytes per token '
               'to be 16B aligned for TMA"')
    rx, rs, rw, w = c.rx, c.rs, c.rw, c.w
    if rx.ndim < 2 or (not g.eager and rx.sizes[0] < g.budget):
        f.invalid(f.INVALID_ARGUMENT)                                               # :3714-3721, :3735-3737
    if c.recipe == FWD and rs is None:
        f.invalid(f.INVALID_ARGUMENT)                                               # :3742
    if w is None:
        f.invalid(f.INVALID_ARGUMENT)                                               # :3760 (forward pass)
    f.c_assert(w.ndim == 2 and w.dtype == torch.float32, 3763, "topk_weights->ndim == 2 && topk_weights->datatype == "
               "ncclFloat32")
    f.c_assert(w.sizes[0] == h.num_tokens, 3764, "topk_weights->sizes[0] == handle->num_tokens")
    f.c_assert(w.sizes[1] == h.num_topk, 3765, "topk_weights->sizes[1] == handle->num_topk")
    rows = em["total"] if g.eager else g.budget                                     # recv_copy_rows, :3886
    if rx.sizes[0] < em["total"]:
        f.invalid(f.INVALID_ARGUMENT, f"NCCL EP: eager dispatch recv buffer too small: {rx.sizes[0]} tokens < "
                  f"{em['total']} required (size from ncclEpLayoutInfo_t::recv_total_counter)")
    if c.recipe == FWD and rs.sizes[0] < rows:
        f.invalid(f.INVALID_ARGUMENT, f"NCCL EP: dispatch recv scale buffer too small: {rs.sizes[0]} rows < {rows} "
                  "required")
    require_windows(g, ((rx, "outputs->tokens"), (rs if c.recipe == FWD else None, "outputs->scales")), "dispatch")
    f.jit_launch("dispatch", f"dispatch_LSATeams1_lsa{g.nranks}_hdim{x.sizes[1]}_maxt{g.max_tokens}")
    if rw is None or c.ridx is not None:
        f.invalid(f.INVALID_ARGUMENT)                                               # :4080-4089
    f.c_assert(rw.dtype == torch.float32, 4096, "recv_topk_weights->datatype == ncclFloat32")
    f.c_assert(rw.ndim == 1, 4098, 'recv_topk_weights->ndim == 1 && "HT EM recv_topk_weights must be 1D '
               '[num_recv_tokens]"')
    if rw.sizes[0] < rows:
        f.invalid(f.INVALID_ARGUMENT)                                               # :4108
    em["order"] = arrival_order(em) if g.config["zero_copy"] == ZERO_COPY_ON else None
    _write(em, gather(g.comm.group, (x.tensor(), c.s.tensor() if c.s else None, w.tensor())),
           rx.tensor(), rs.tensor() if c.recipe == FWD else None, rw.tensor())


def arrival_order(em) -> torch.Tensor:
    """Zero copy ON: the receivers fan the tokens out to their experts as they arrive (docs/zero-copy.md), so a row's
    place within its expert's zone differs from one dispatch to the next; combine reads them where the last dispatch
    put them. The fake draws a fresh order per dispatch: a caller that combines rows laid out by another dispatch
    gets wrong sums, as on a GPU. [total]: the stored row of each row in (expert, source rank, token) order."""
    em["draws"] = em.get("draws", 0) + 1
    g, order, start = torch.Generator().manual_seed(em["draws"]), torch.arange(em["total"]), 0
    for n in em["padded"]:
        order[start:start + n] = start + torch.randperm(n, generator=g)
        start += n
    return order


def _rows(em, b: int, n: int):
    """Where rows b .. b + n (in (expert, source rank, token) order) lie after the last dispatch."""
    return slice(b, b + n) if em.get("order") is None else em["order"][b:b + n]


def _write(em, sent, rx, rs, rw) -> None:
    total = em["total"]
    for t in (rx, rs, rw):
        if t is not None:
            u8(t[:total]).zero_()                       # the zones' padding rows
            garbage(t[total:])
    for (_, s, toks, ks), b in zip(em["pairs"], em["begins"]):
        n, (xs, ss, ws), at = len(toks), sent[s], _rows(em, b, len(toks))
        u8(rx)[at] = u8(xs)[toks]
        if rs is not None:
            u8(rs)[at] = u8(ss)[toks]
        rw[at] = ws[toks, ks]


def combine(h, c) -> None:
    g, y, em, mtb = h.group, c.x, h.em, h.group.config["max_token_bytes"]
    if y.ndim == 0:
        f.invalid(f.INVALID_ARGUMENT)                                               # :4548
    f.c_assert(y.ndim == 2, 4551, "x->ndim == 2", COMBINE)
    f.c_assert(y.row_bytes % 16 == 0, 4566, "(hidden * ncclTypeSize(x->datatype)) % sizeof(int4) == 0", COMBINE)
    if c.w is not None:
        f.invalid(f.INVALID_ARGUMENT)                                               # :4636-4639 (forward pass)
    out = c.rx
    if out.ndim == 0:
        f.invalid(f.INVALID_ARGUMENT)                                               # :4643-4645
    f.c_assert(out.ndim == 2, 4646, "combined_x->ndim == 2", COMBINE)
    f.c_assert(out.sizes[0] == h.num_tokens, 4647, "combined_x->sizes[0] == num_combined_tokens", COMBINE)
    f.c_assert(out.sizes[1] == y.sizes[1], 4648, "combined_x->sizes[1] == hidden", COMBINE)
    f.overrun(y.row_bytes <= mtb, f"combine rows of {y.row_bytes} bytes ({y.sizes[1]} x {y.dtype}) exceed the "
              f"group's max_token_bytes {mtb}: NCCL EP stages combine rows in slots of max_token_bytes "
              "(expert_input_token: token_staging_slots x max_token_bytes, nccl_ep.cc:1058-1063; launch_combine_reduce "
              "copies rows of hidden x dtype bytes, :4695-4710) and writes past that staging: corrupt sums or an "
              "illegal address, no error")
    f.device_assert(y.sizes[0] >= em["total"], "local_permute_reduce (device ht_ep.cuh:5374)",
                    f"es < caller_num_recv_tokens: combine input has {y.sizes[0]} rows, the routing {em['total']}")
    require_windows(g, ((y, "inputs->tokens"),), "combine")
    f.jit_launch("combine", f"combine_LSATeams1_lsa{g.nranks}_hdim{y.sizes[1]}")
    rows, send = y.tensor(), {}
    for (_, s, toks, _), b in zip(em["pairs"], em["begins"]):
        send.setdefault(s, []).append((toks, rows[_rows(em, b, len(toks))]))
    res = torch.zeros(out.sizes, dtype=torch.float32)
    for sent in gather(g.comm.group, send):
        for toks, part in sent.get(g.rank, []):
            res.index_add_(0, toks, part.float())
    out.tensor().copy_(res)
