"""LOW_LATENCY EXPERT_MAJOR dispatch and combine (ext `nccl_ep.cc:3319-3411`, `:4327-4445`).

dispatch reads the routing bound to the handle (the caller's topk_idx, where it lies now) and packs each
(token, local expert) into [L, R x M, H] from slot 0, by source rank then token, writing layout_info.
expert_counters (int32 [L]); the other slots hold what the caller's buffer held (the fake: NaN, 0x7F bytes for
fp8). combine weighs each expert's row by outputs.topk_weights [T, K] and sums a token's rows in fp32. Each LL
message is a slot of max_token_bytes (plus combine's scale metadata, `include/common.hpp:254-262`): a combine row of
more bytes (bf16, 2 x H) writes past its slot, which the library does not check: the fake refuses it
(failures.overrun).
"""
from __future__ import annotations

import torch
from gloo_bytes import garbage, gather, u8

from . import failures as f
from .failures import COMBINE
from .recipes import FWD


def dispatch(h, c) -> None:
    g, x, L, R, M = h.group, c.x, h.group.local_experts, h.group.nranks, h.group.max_tokens
    f.c_assert(x.sizes[0] == h.num_tokens, 3322, "x->sizes[0] == handle->num_tokens")
    f.c_assert(x.sizes[0] <= M, 3323, "x->sizes[0] <= group->config.max_dispatch_tokens_per_rank")
    if c.recipe == FWD:
        f.c_assert(x.row_bytes % 16 == 0, 3327, "(x->sizes[1] * ncclTypeSize(x->datatype)) % sizeof(int4) == 0")
    else:
        f.c_assert(x.sizes[1] % 16 == 0, 3329, "x->sizes[1] % sizeof(int4) == 0")
    f.c_assert(x.row_bytes <= g.config["max_token_bytes"], 3331,
               "x->sizes[1] * ncclTypeSize(x->datatype) <= group->config.max_token_bytes")
    rx, H = c.rx, x.sizes[1]
    f.c_assert(rx.ndim == 3, 3388, "recv_x->ndim == 3")
    f.c_assert(rx.sizes[0] == L, 3389, "recv_x->sizes[0] == group->num_local_experts")
    f.c_assert(rx.sizes[1] == R * M, 3390, "recv_x->sizes[1] == num_recv_tokens")
    f.c_assert(rx.sizes[2] == H, 3391, "recv_x->sizes[2] == static_cast<unsigned>(hidden)")
    f.c_assert(c.w is None, 3392, "topk_weights_in == nullptr")
    f.c_assert(c.rw is None, 3393, "recv_topk_weights == nullptr")
    f.c_assert(c.ridx is None, 3394, "recv_topk_idx == nullptr")
    f.c_assert(c.ranks is None, 3395, "src_rank_counter == nullptr")
    cnt = c.counters
    f.c_assert(cnt is not None, 3407, "recv_count != nullptr")
    f.c_assert(cnt.ndim == 1, 3408, "recv_count->ndim == 1")
    f.c_assert(cnt.dtype == torch.int32, 3409, "recv_count->datatype == ncclInt32")
    f.c_assert(cnt.sizes[0] == L, 3410, "recv_count->sizes[0] == group->num_local_experts")
    idx = h.idx.tensor().to(torch.int64)
    f.jit_launch("LL dispatch", f"ll_dispatch_hdim{H}_em_topk{h.num_topk}_recipe{c.recipe}"
                 f"_topk{64 if h.idx.dtype == torch.int64 else 32}")
    sent = gather(g.comm.group, (x.tensor(), c.s.tensor() if c.s else None, idx))
    recv, scales = rx.tensor(), c.rs.tensor() if c.rs else None
    for t in (recv, scales):
        if t is not None:
            garbage(t)
    counts, h.ll = [0] * L, {}
    for e in range(L):
        for s, (xs, ss, ids) in enumerate(sent):
            toks = (ids == g.rank * L + e).any(1).nonzero().flatten()
            b, n = counts[e], len(toks)
            u8(recv[e])[b:b + n] = u8(xs)[toks]
            if scales is not None:
                u8(scales[e])[b:b + n] = u8(ss)[toks]
            h.ll[(e, s)] = (toks, b, n)
            counts[e] += n
    cnt.tensor().copy_(torch.tensor(counts))


def combine(h, c) -> None:
    g, y, L, R, M = h.group, c.x, h.group.local_experts, h.group.nranks, h.group.max_tokens
    f.host_assert(c.rw is not None, 4345, 'topk_weights != nullptr && "expert-major combine requires topk_weights in '
                  'outputs"')
    f.c_assert(y.ndim == 3, 4367, "x->ndim == 3", COMBINE)
    f.c_assert(y.sizes[0] == L, 4368, "x->sizes[0] == num_experts / num_ranks", COMBINE)
    f.c_assert(y.sizes[1] == R * M, 4369, "x->sizes[1] == static_cast<unsigned>(num_ranks) * "
               "num_max_dispatch_tokens_per_rank", COMBINE)
    f.c_assert(y.sizes[2] % 16 == 0, 4370, "x->sizes[2] % sizeof(int4) == 0", COMBINE)
    f.c_assert(y.sizes[2] % 128 == 0, 4371, "x->sizes[2] % 128 == 0", COMBINE)
    w, idx = c.rw, h.idx
    f.c_assert(w.ndim == 2, 4417, "topk_weights->ndim == 2", COMBINE)
    f.c_assert(w.sizes == idx.sizes, 4418, "topk_weights->sizes[0..1] == topk_idx->sizes[0..1]", COMBINE)
    f.c_assert(w.dtype == torch.float32, 4420, "topk_weights->datatype == ncclFloat32", COMBINE)
    f.c_assert(w.sizes[0] <= M, 4421, "topk_weights->sizes[0] <= num_max_dispatch_tokens_per_rank", COMBINE)
    out = c.rx
    f.c_assert(out.ndim == 2, 4439, "out->ndim == 2", COMBINE)
    f.c_assert(out.sizes[0] == idx.sizes[0], 4440, "out->sizes[0] == num_combined_tokens", COMBINE)
    f.c_assert(out.sizes[1] == y.sizes[2], 4441, "out->sizes[1] == hidden", COMBINE)
    f.c_assert(out.dtype == y.dtype, 4442, "out->datatype == x->datatype", COMBINE)
    mtb = g.config["max_token_bytes"]
    f.overrun(y.row_bytes <= mtb, f"LL combine rows of {y.row_bytes} bytes exceed the group's max_token_bytes {mtb}: "
              "each combine message is a slot of max_token_bytes plus scale metadata (include/common.hpp:254-262); "
              "the real kernel writes past its slot into the next message: corrupt sums, no error")
    f.unsupported(h.ll is not None, "LL combine before any dispatch on this handle")
    f.jit_launch("combine", f"ll_combine_hdim{y.sizes[2]}_em_topk{h.num_topk}")
    rows = y.tensor()
    send = {k: (toks, rows[k[0], b:b + n]) for k, (toks, b, n) in h.ll.items()}
    ids, weights = idx.tensor().to(torch.int64), w.tensor().float()
    res = torch.zeros(out.sizes, dtype=torch.float32)
    for d, sent in enumerate(gather(g.comm.group, send)):
        for e in range(L):
            toks, part = sent[(e, g.rank)]
            wt = (weights[toks] * (ids[toks] == d * L + e)).sum(1, keepdim=True)
            res.index_add_(0, toks, part.float() * wt)
    out.tensor().copy_(res)
