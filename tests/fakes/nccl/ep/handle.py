"""Fake `nccl.ep.Handle` and its dataclasses (whl `nccl/ep/handle.py`): HT and LL expert-major over gloo.

HT EXPERT_MAJOR (header `nccl_ep.h:836-876`; ext `nccl_ep.cc:3600-3930`): `create_handle`/`update` exchange the
routing (the ncclAllGather at `:3014`) and fill LayoutInfo: expert_counters [L] (per-local-expert rows, padded to
HandleConfig.dispatch_output_per_expert_alignment), expert_offsets [L] (exclusive prefix), recv_total_counter [1].
dispatch writes one row per (source token, local expert), grouped by local expert, then source rank, then token;
padding rows and rows past the total are zero; outputs.topk_weights is 1-D (that pair's weight). combine sums the
rows of each token (the caller applied the weights, whl `enums.py:57-63`), fp32 accumulate.
LL EXPERT_MAJOR (`:3319-3411`, `:4338-4375`): create_handle binds the routing (read at dispatch); dispatch packs
each (token, local expert) into [L, R*M, H] from slot 0 (source rank, then token) and writes expert_counters; other
slots hold NaN (the caller's torch.empty garbage). combine weighs each expert's row by outputs.topk_weights.
DispatchQuantizationRecipe.FWD forwards tokens and scales byte for byte (`nccl_ep.h:746-792`), in both.
`calls` lists the API calls the handle received ("update", "dispatch", "combine", "complete", "destroy").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nccl.core import NcclInvalid
from nccl.ep import _sim
from nccl.ep.enums import CombineQuantizationRecipe, DispatchQuantizationRecipe, ExpertIdKind, PassDir

__all__ = ["CombineConfig", "CombineInputs", "CombineOutputs", "DispatchConfig", "DispatchInputs",
           "DispatchOutputs", "Handle", "HandleConfig", "LayoutInfo"]
Q = DispatchQuantizationRecipe


@dataclass
class HandleConfig:                                          # handle.py:49-67
    dispatch_output_per_expert_alignment: int = 0


@dataclass
class DispatchConfig:                                        # handle.py:70-98
    send_only: int = 0
    round_scales: int = 0
    pass_direction: PassDir = PassDir.FWD
    quantization_recipe: DispatchQuantizationRecipe = DispatchQuantizationRecipe.NONE


@dataclass
class CombineConfig:                                         # handle.py:101-125
    send_only: int = 0
    pass_direction: PassDir = PassDir.FWD
    quantization_recipe: CombineQuantizationRecipe = CombineQuantizationRecipe.NONE


@dataclass
class LayoutInfo:                                            # handle.py:128-164
    expert_counters: object = None
    src_rank_counters: object = None
    expert_offsets: object = None
    recv_total_counter: object = None
    recv_topk_idx_kind: ExpertIdKind = ExpertIdKind.AUTO


@dataclass
class DispatchInputs:                                        # handle.py:167-188
    tokens: object = None
    topk_weights: object = None
    scales: object = None


@dataclass
class DispatchOutputs:                                       # handle.py:191-216
    tokens: object = None
    topk_weights: object = None
    scales: object = None
    topk_idx: object = None


@dataclass
class CombineInputs:                                         # handle.py:219-239
    tokens: object = None
    topk_weights: object = None
    scales: object = None


@dataclass
class CombineOutputs:                                        # handle.py:242-260
    tokens: object = None
    topk_weights: object = None


def _b(t):
    return None if t is None else t.buffer


def _pairs(idxs, me, L):
    """(l, s, tokens, k) of the (token, local expert) pairs rank `me` receives: by local expert, source rank, token."""
    out = []
    for l in range(L):
        for s, idx in enumerate(idxs):
            hit = idx == me * L + l
            toks = hit.any(1).nonzero().flatten()
            out.append((l, s, toks, hit[toks].int().argmax(1)))
    return out


class Handle:
    def __init__(self, group, layout, align: int, num_topk: int) -> None:
        self._ptr, self.group, self.layout, self.align, self.num_topk = id(self), group, layout, align, num_topk
        self.calls: list[str] = []
        self._idx = self._em = self._ll = None

    def _check_valid(self, operation: str) -> None:
        if not self._ptr:
            raise NcclInvalid(f"Cannot {operation}: Handle is not initialized or has been destroyed")

    @property
    def ptr(self) -> int:
        self._check_valid("read ptr")
        return self._ptr

    # ------------------------------------------------------------------ routing
    def update(self, topk_idx, *, layout_info: LayoutInfo | None = None, stream) -> None:
        """`ncclEpUpdateHandle` (ext `nccl_ep.cc:2893-3160`): HT exchanges the routing here (collective)."""
        self._check_valid("update")
        self.calls.append("update")
        self._update(topk_idx, layout_info)

    def _update(self, topk_idx, layout_info):
        g, f = self.group, "ncclResult_t ncclEpUpdateHandle(...)"
        _sim.c_assert(topk_idx.ndim == 2, 2908, "topk_idx->ndim == 2", f)
        idx = topk_idx.buffer
        _sim.c_assert(idx.dtype in (torch.int32, torch.int64), 2915, '(topk_idx->datatype == ncclInt32 || '
                      'topk_idx->datatype == ncclInt64) && "topk_idx must be ncclInt32 or ncclInt64"', f)
        self._idx, self.num_tokens = topk_idx, idx.shape[0]      # the descriptor is kept; LL reads it at dispatch
        if not g.ht:
            _sim.c_assert(idx.shape[1] == self.num_topk, 2927, '... && "LL: num_topk mismatch between '
                          'ncclEpInitHandle and ncclEpUpdateHandle"', f)
            _sim.c_assert(layout_info is None, 2930, 'layout_info == nullptr && "LL mode does not accept local '
                          'tensors in ncclEpUpdateHandle"', f)
            return
        _sim.c_assert(idx.shape[1] == self.num_topk, 2939, '... && "Given topk_idx has unmatched num_topk that '
                      'ncclEpHandle was created with!"', f)
        _sim.c_assert(self.num_tokens <= g.config.max_dispatch_tokens_per_rank, 2944,
                      '... && "Token count exceeds HT buffer capacity"', f)
        L = g.num_local_experts
        pairs = _pairs(_sim.gather(g.group, idx.to(torch.int64)), g.rank, L)
        counts = [sum(len(p[2]) for p in pairs if p[0] == l) for l in range(L)]
        padded = [-(-c // self.align) * self.align for c in counts]
        offsets = [sum(padded[:l]) for l in range(L)]
        begins, seen = [], [0] * L
        for l, s, toks, ks in pairs:
            begins.append(offsets[l] + seen[l])
            seen[l] += len(toks)
        self._em = dict(pairs=pairs, begins=begins, padded=padded, offsets=offsets, total=sum(padded))
        if layout_info is not None:
            for name, vals in (("expert_counters", padded), ("expert_offsets", offsets),
                               ("recv_total_counter", [sum(padded)])):
                t = _b(getattr(layout_info, name))
                if t is not None:
                    _sim.fake_check(t.dim() == 1 and t.numel() == len(vals), f"LayoutInfo.{name} must be [{len(vals)}]")
                    t.copy_(torch.tensor(vals, dtype=torch.int64))

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, inputs: DispatchInputs, outputs: DispatchOutputs, *, layout_info: LayoutInfo | None = None,
                 config: DispatchConfig | None = None, stream) -> None:
        self._check_valid("dispatch")
        self.calls.append("dispatch")
        cfg, g = config or DispatchConfig(), self.group
        _sim.fake_check(inputs.tokens is not None and outputs.tokens is not None, "tokens are required")
        x, recipe = inputs.tokens, cfg.quantization_recipe
        line = 3320 if not g.ht else 3611
        _sim.c_assert(x.ndim == 2, line + 1, "x->ndim == 2")
        _sim.c_assert(x.sizes[0] == self.num_tokens, line + 2, "x->sizes[0] == handle->num_tokens")
        _sim.c_assert(x.sizes[0] <= g.config.max_dispatch_tokens_per_rank, line + 3,
                      "x->sizes[0] <= group->config.max_dispatch_tokens_per_rank")
        xb, sb = x.buffer, _b(inputs.scales)
        row_bytes = xb.shape[1] * xb.element_size() + (sb.shape[1] * sb.element_size() if sb is not None else 0)
        _sim.c_assert(xb.shape[1] * xb.element_size() <= g.config.max_token_bytes, line + 4,
                      "x->sizes[1] * ncclTypeSize(x->datatype) <= group->config.max_token_bytes")
        _sim.fake_check(recipe != Q.FWD or row_bytes <= g.config.max_token_bytes,
                        "under FWD max_token_bytes must cover the token and scale bytes (nccl_ep.h:746-792)")
        _sim.fake_check(recipe != Q.DS_FP8E3M4, "DS_FP8E3M4 (LL internal quantization) is not simulated")
        _sim.fake_check((sb is not None) == (recipe == Q.FWD), "inputs.scales: required by FWD, absent otherwise")
        _sim.fake_check(recipe == Q.FWD or xb.dtype in (torch.bfloat16, torch.float16, torch.float32),
                        "fp8/fp4 tokens travel only through the FWD recipe")
        _sim.fake_check(_b(outputs.tokens).dtype == xb.dtype, "output token dtype must equal the input's")
        (self._ht_dispatch if g.ht else self._ll_dispatch)(inputs, outputs, layout_info, cfg)

    def _ht_dispatch(self, inputs, outputs, layout_info, cfg):
        g, em, fwd = self.group, self._em, cfg.quantization_recipe == Q.FWD
        xb, sb, wb = inputs.tokens.buffer, _b(inputs.scales), _b(inputs.topk_weights)
        _sim.c_assert((g.num_local_experts * g.nranks * 4) % 16 == 0, 3669, '(experts_per_lsa_team * static_cast<int>'
                      '(sizeof(float))) % 16 == 0 && "HT dispatch requires experts_per_lsa_team to be multiple of 4 '
                      '(16B prob TMA alignment)"')
        _sim.c_assert(xb.shape[1] * xb.element_size() % 16 == 0, 3673,
                      '(token_bytes % 16) == 0 && "HT dispatch requires token bytes per token to be 16B aligned for TMA"')
        rx, rs, rw = outputs.tokens.buffer, _b(outputs.scales), _b(outputs.topk_weights)
        if rx.dim() < 2 or (not g.eager and rx.shape[0] < g.max_recv_tokens):
            _sim.invalid(_sim.INVALID_ARGUMENT)                                    # :3719, :3737
        if fwd and rs is None:
            _sim.invalid(_sim.INVALID_ARGUMENT)                                    # :3742
        if cfg.pass_direction == PassDir.FWD:
            if wb is None:
                _sim.invalid(_sim.INVALID_ARGUMENT)                                # :3760
            _sim.c_assert(wb.dim() == 2 and wb.dtype == torch.float32, 3763,
                          "topk_weights->ndim == 2 && topk_weights->datatype == ncclFloat32")
            _sim.c_assert(tuple(wb.shape) == (self.num_tokens, self.num_topk), 3764,
                          "topk_weights->sizes[0] == handle->num_tokens && topk_weights->sizes[1] == handle->num_topk")
        elif wb is not None or rw is not None or outputs.topk_idx is not None:
            _sim.invalid(_sim.INVALID_ARGUMENT)                                    # :3773
        total = em["total"]
        if total > g.max_recv_tokens:
            raise RuntimeError(f"fake nccl.ep: {total} recv rows overflow max_recv_tokens_per_rank "
                               f"{g.max_recv_tokens}: the real kernel traps (OverflowPolicy.TRAP), aborting")
        if g.eager and rx.shape[0] < total:
            _sim.invalid(_sim.INVALID_ARGUMENT, f"NCCL EP: eager dispatch recv buffer too small: {rx.shape[0]} tokens "
                         f"< {total} required (size from ncclEpLayoutInfo_t::recv_total_counter)")
        need = total if g.eager else g.max_recv_tokens
        if fwd and rs.shape[0] < need:
            _sim.invalid(_sim.INVALID_ARGUMENT,
                         f"NCCL EP: dispatch recv scale buffer too small: {rs.shape[0]} rows < {need} required")
        _sim.fake_check(rw is None or (rw.dim() == 1 and rw.shape[0] >= total),
                        "expert-major outputs.topk_weights is 1-D [slots]")
        _sim.jit_launch("dispatch", f"dispatch_LSATeams1_lsa{g.nranks}_hdim{xb.shape[1]}_maxt"
                        f"{g.config.max_dispatch_tokens_per_rank}")
        sent = _sim.gather(g.group, (xb, sb, wb))
        for t in (rx, rs, rw):
            if t is not None:
                _sim.u8(t).zero_()
        for (l, s, toks, ks), b in zip(em["pairs"], em["begins"]):
            n, (xs, ss, ws) = len(toks), sent[s]
            _sim.u8(rx)[b:b + n] = _sim.u8(xs)[toks]
            if rs is not None:
                _sim.u8(rs)[b:b + n] = _sim.u8(ss)[toks]
            if rw is not None and ws is not None:
                rw[b:b + n] = ws[toks, ks]

    def _ll_dispatch(self, inputs, outputs, layout_info, cfg):
        g, fwd, L, R = self.group, cfg.quantization_recipe == Q.FWD, self.group.num_local_experts, self.group.nranks
        M = g.config.max_dispatch_tokens_per_rank
        xb, sb, rx, rs = inputs.tokens.buffer, _b(inputs.scales), outputs.tokens.buffer, _b(outputs.scales)
        H = xb.shape[1]
        if fwd:
            _sim.c_assert(H * xb.element_size() % 16 == 0, 3327,
                          "(x->sizes[1] * ncclTypeSize(x->datatype)) % sizeof(int4) == 0")
        else:
            _sim.c_assert(H % 16 == 0, 3329, "x->sizes[1] % sizeof(int4) == 0")
        _sim.c_assert(rx.dim() == 3, 3388, "recv_x->ndim == 3")
        _sim.c_assert(rx.shape[0] == L, 3389, "recv_x->sizes[0] == group->num_local_experts")
        _sim.c_assert(rx.shape[1] == R * M, 3390, "recv_x->sizes[1] == num_recv_tokens")
        _sim.c_assert(rx.shape[2] == H, 3391, "recv_x->sizes[2] == static_cast<unsigned>(hidden)")
        _sim.c_assert(inputs.topk_weights is None, 3392, "topk_weights_in == nullptr")
        _sim.c_assert(outputs.topk_weights is None, 3393, "recv_topk_weights == nullptr")
        _sim.c_assert(outputs.topk_idx is None, 3394, "recv_topk_idx == nullptr")
        _sim.c_assert(layout_info is None or layout_info.src_rank_counters is None, 3395, "src_rank_counter == nullptr")
        cnt = _b(layout_info.expert_counters) if layout_info is not None else None
        _sim.c_assert(cnt is not None, 3407, "recv_count != nullptr")
        _sim.c_assert(cnt.dim() == 1, 3408, "recv_count->ndim == 1")
        _sim.c_assert(cnt.dtype == torch.int32, 3409, "recv_count->datatype == ncclInt32")
        _sim.c_assert(cnt.shape[0] == L, 3410, "recv_count->sizes[0] == group->num_local_experts")
        _sim.fake_check(not fwd or (rs is not None and tuple(rs.shape[:2]) == (L, R * M) and rs.dtype == sb.dtype),
                        "FWD needs outputs.scales [L, R*M, S] of the input scales' dtype")
        _sim.jit_launch("LL dispatch", f"ll_dispatch_hdim{H}_em_topk{self.num_topk}_recipe{int(cfg.quantization_recipe)}"
                        f"_topk{64 if self._idx.buffer.dtype == torch.int64 else 32}")
        sent = _sim.gather(g.group, (xb, sb, self._idx.buffer.to(torch.int64)))
        _sim.garbage(rx)
        if rs is not None:
            _sim.garbage(rs)
        counts, self._ll = [0] * L, {}
        for l in range(L):
            for s, (xs, ss, idx) in enumerate(sent):
                toks = (idx == g.rank * L + l).any(1).nonzero().flatten()
                b, n = counts[l], len(toks)
                _sim.u8(rx[l])[b:b + n] = _sim.u8(xs)[toks]
                if rs is not None:
                    _sim.u8(rs[l])[b:b + n] = _sim.u8(ss)[toks]
                self._ll[(l, s)] = (toks, b, n)
                counts[l] += n
        cnt.copy_(torch.tensor(counts, dtype=torch.int32))

    # ------------------------------------------------------------------ combine
    def combine(self, inputs: CombineInputs, outputs: CombineOutputs, *, config: CombineConfig | None = None,
                stream) -> None:
        self._check_valid("combine")
        self.calls.append("combine")
        cfg, g = config or CombineConfig(), self.group
        _sim.fake_check(inputs.tokens is not None and outputs.tokens is not None, "tokens are required")
        _sim.fake_check(cfg.quantization_recipe == CombineQuantizationRecipe.NONE, "NVFP4 combine is not simulated")
        out = outputs.tokens.buffer
        _sim.fake_check(tuple(out.shape) == (self.num_tokens, inputs.tokens.sizes[-1]), "outputs.tokens is [T, H]")
        y, me, res = inputs.tokens.buffer, g.rank, torch.zeros(out.shape, dtype=torch.float32)
        if g.ht:
            em = self._em
            _sim.fake_check(y.dim() == 2 and y.shape[0] >= em["total"], "HT expert-major combine input is [slots, H]")
            _sim.fake_check(cfg.pass_direction == PassDir.BWD or inputs.topk_weights is None,
                            "FWD combine forbids inputs.topk_weights")
            _sim.jit_launch("combine", f"combine_LSATeams1_lsa{g.nranks}_hdim{y.shape[1]}")
            send = {}
            for (l, s, toks, ks), b in zip(em["pairs"], em["begins"]):
                send.setdefault(s, []).append((toks, y[b:b + len(toks)]))
            for sent_d in _sim.gather(g.group, send):
                for toks, rows in sent_d.get(me, []):
                    res.index_add_(0, toks, rows.float())
        else:
            L, R, M = g.num_local_experts, g.nranks, g.config.max_dispatch_tokens_per_rank
            f = "ncclResult_t ncclEpCombine(...)"
            _sim.c_assert(y.dim() == 3, 4367, "x->ndim == 3", f)
            _sim.c_assert(y.shape[0] == L, 4368, "x->sizes[0] == num_experts / num_ranks", f)
            _sim.c_assert(y.shape[1] == R * M, 4369, "x->sizes[1] == static_cast<unsigned>(num_ranks) * "
                          "num_max_dispatch_tokens_per_rank", f)
            _sim.c_assert(y.shape[2] % 16 == 0, 4370, "x->sizes[2] % sizeof(int4) == 0", f)
            _sim.c_assert(y.shape[2] % 128 == 0, 4371, "x->sizes[2] % 128 == 0", f)
            _sim.host_assert(outputs.topk_weights is not None, 4345, 'topk_weights != nullptr && "expert-major '
                             'combine requires topk_weights in outputs"')
            _sim.fake_check(self._ll is not None, "LL combine before any dispatch on this handle")
            _sim.jit_launch("combine", f"ll_combine_hdim{y.shape[2]}_em_topk{self.num_topk}")
            send = {k: (toks, y[l, b:b + n]) for k, (toks, b, n) in self._ll.items() for l in [k[0]]}
            idx, w = self._idx.buffer.to(torch.int64), outputs.topk_weights.buffer.float()
            for d, sent_d in enumerate(_sim.gather(g.group, send)):
                for l in range(L):
                    toks, rows = sent_d[(l, me)]
                    wt = (w[toks] * (idx[toks] == d * L + l)).sum(1, keepdim=True)
                    res.index_add_(0, toks, rows.float() * wt)
        out.copy_(res.to(out.dtype))

    def complete(self, *, config: int = 0, stream) -> None:
        """LL send_only completion (`ncclEpComplete`, ext `nccl_ep.cc:4923`): the fake's transfers are never staged."""
        self._check_valid("complete")
        self.calls.append("complete")

    def destroy(self) -> None:
        if self._ptr:
            self.calls.append("destroy")
            self._ptr = 0

    def __repr__(self) -> str:
        return f"<Handle ptr={self._ptr:#x}>" if self._ptr else "<Handle destroyed>"
