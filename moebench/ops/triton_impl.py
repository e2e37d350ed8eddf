"""Triton implementation of permute / unpermute / sort_chunks_by_idxs.

Permute runs in three launches, no host sync before the copy:
1. ``_route_rank``: slots split in blocks of SB; per block, a sort of (expert, slot) keys gives
   each slot its stable rank among the block's slots of the same expert, and a histogram the
   block's per-expert counts.
2. ``_route_scan``: one program per 64 experts turns the [NB, E] counts into each block's first
   row per expert; the last program to finish scans the totals: expert starts (padded to
   ``pad_multiple``), tokens per expert, and the row count (also stored to a pinned host slot,
   so the host waits on one event, not a copy).
3. ``_permute_copy``: one program per token reads its row once and stores it to its K rows
   (row = expert start + block base + rank), writing row_map on the way; fp8 scales ride along.
   ``_permute_copy_tma`` does the same with each row write as a TMA bulk store through a host
   tensor descriptor (Hopper+, rows a multiple of 16 bytes; knob COPY_TMA), else
   ``_permute_copy`` runs.
Payload rows are copied as raw words (int32 when the row is a multiple of 4 bytes), so bf16 and
fp8 share one kernel.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton without host-side tensor descriptors (< 3.3)
    TensorDescriptor = None


def _interpreter_numpy_shim() -> None:
    """Triton 3.6's interpreter holds scalars as 1-element arrays and converts them with
    ``int(array)``, which numpy >= 2.4 refuses ("only 0-dimensional arrays ..."), so any loop with
    a run-time bound fails under TRITON_INTERPRET=1. Convert with ``.item()`` instead."""
    from triton.runtime import interpreter as itp
    orig = getattr(itp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_moebench_shim", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._moebench_shim = True
    itp._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_numpy_shim()

# Tunables (per-kernel block sizes); env overrides exist for the benchmark's sweeps.
COPY_BH = int(os.environ.get("MOEBENCH_TRITON_COPY_BH", "1024"))     # words per chunk (permute)
COPY_WARPS = int(os.environ.get("MOEBENCH_TRITON_COPY_WARPS", "4"))
UNPERM_BH = int(os.environ.get("MOEBENCH_TRITON_UNPERM_BH", "1024"))  # elements per chunk
UNPERM_WARPS = int(os.environ.get("MOEBENCH_TRITON_UNPERM_WARPS", "4"))
# 1: permute's row writes are TMA bulk stores (``_permute_copy_tma``) where the device and the
# shape allow it (compute capability >= 9, or the interpreter; rows a multiple of 16 bytes);
# 0 (default): the plain ``_permute_copy``. On the H200 both kernels take the same time (149.1 vs
# 148.5 us at T 4096, H 7168: bench/results/permute-h200.jsonl, impl triton@...:1) and the
# descriptor costs host time, so TMA is opt-in.
COPY_TMA = int(os.environ.get("MOEBENCH_TRITON_COPY_TMA", "0"))
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _route_rank(idx_ptr, n_slots, E, lrank_ptr, counts_ptr, done_ptr, SB: tl.constexpr,
                EP: tl.constexpr):
    b = tl.program_id(0)
    if b == 0:
        tl.store(done_ptr, 0)  # _route_scan's arrival counter
    i = tl.arange(0, SB)
    s = b * SB + i
    e = tl.load(idx_ptr + s, mask=s < n_slots, other=-1).to(tl.int32)
    e = tl.where((e >= 0) & (e < E), e, E)                       # E = masked bucket
    hist = tl.histogram(e, EP)
    first = tl.cumsum(hist, 0) - hist
    sk = tl.sort(e * SB + i)
    se = sk // SB
    ss = sk % SB
    rank = i - tl.gather(first, se, 0)
    tl.store(lrank_ptr + b * SB + ss, rank, mask=se < E)
    eo = tl.arange(0, EP)
    tl.store(counts_ptr + b * E + eo, hist, mask=eo < E)


@triton.jit
def _route_scan(counts_ptr, NB, E, pad, tpe_ptr, estart_ptr, ecount_ptr, total_ptr, done_ptr,
                host_ptr, slot, BB: tl.constexpr, EB: tl.constexpr, HOST: tl.constexpr):
    """Program p takes experts [p*EB, (p+1)*EB): counts [NB, E] -> in place, each block's first
    row per expert relative to the expert's start; ecount = totals. The last program to arrive
    scans the padded totals: expert starts, tokens per expert and the row count (HOST: also to
    host_ptr[slot], pinned host memory the GPU writes directly)."""
    eo = tl.program_id(0) * EB + tl.arange(0, EB)
    me = eo < E
    run = tl.zeros([EB], tl.int32)
    for b0 in range(0, NB, BB):
        bo = b0 + tl.arange(0, BB)
        m = (bo[:, None] < NB) & me[None, :]
        ptr = counts_ptr + bo[:, None] * E + eo[None, :]
        c = tl.load(ptr, mask=m, other=0)
        tl.store(ptr, run[None, :] + tl.cumsum(c, 0) - c, mask=m)
        run += tl.sum(c, 0)
    tl.store(ecount_ptr + eo, run, mask=me)
    tl.debug_barrier()  # every thread's stores before the release below
    if tl.atomic_add(done_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        carry = tl.sum(tl.zeros([EB], tl.int32), 0)
        for e0 in range(0, E, EB):
            eo = e0 + tl.arange(0, EB)
            me = eo < E
            tot = tl.load(ecount_ptr + eo, mask=me, other=0, cache_modifier=".cg")
            padded = tot
            if pad > 0:
                padded = (tot + pad - 1) // pad * pad
            tl.store(tpe_ptr + eo, padded, mask=me)
            tl.store(estart_ptr + eo, carry + tl.cumsum(padded, 0) - padded, mask=me)
            carry += tl.sum(padded, 0)
        tl.store(total_ptr, carry)
        if HOST:
            tl.store(host_ptr + slot, carry)


@triton.jit
def _slot_rows(idx_ptr, lrank_ptr, base_ptr, estart_ptr, row_map_ptr, t, E, SB, K: tl.constexpr,
               KP: tl.constexpr):
    """Token t's K output rows (expert start + block base + rank; -1 for skipped slots), also
    written to row_map. Padded to KP lanes (-1 past K)."""
    ks = tl.arange(0, KP)
    mk = ks < K
    s = t * K + ks
    e = tl.load(idx_ptr + s, mask=mk, other=-1).to(tl.int32)
    ok = mk & (e >= 0) & (e < E)
    row = (tl.load(estart_ptr + e, mask=ok, other=0)
           + tl.load(base_ptr + (s // SB) * E + e, mask=ok, other=0)
           + tl.load(lrank_ptr + s, mask=ok, other=0))
    row = tl.where(ok, row, -1)
    tl.store(row_map_ptr + s, row, mask=mk)
    return row


@triton.jit
def _copy_scales(s_ptr, outs_ptr, t, row, WS, KP: tl.constexpr, BS: tl.constexpr):
    """Token t's scale row (WS words) to its rows (row >= 0)."""
    ok = row >= 0
    row64 = tl.where(ok, row, 0).to(tl.int64)
    hs = tl.arange(0, BS)
    ms = hs < WS
    v = tl.load(s_ptr + t * WS + hs, mask=ms)
    tl.store(outs_ptr + row64[:, None] * WS + hs[None, :], tl.broadcast_to(v[None, :], (KP, BS)),
             mask=ok[:, None] & ms[None, :])


@triton.jit
def _permute_copy(x_ptr, s_ptr, out_ptr, outs_ptr, idx_ptr, lrank_ptr, base_ptr, estart_ptr,
                  row_map_ptr, W, WS, E, SB, K: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr,
                  HAS_S: tl.constexpr, BS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    row = _slot_rows(idx_ptr, lrank_ptr, base_ptr, estart_ptr, row_map_ptr, t, E, SB, K, KP)
    ok = row >= 0
    row64 = row.to(tl.int64)
    for h0 in range(0, W, BH):
        h = h0 + tl.arange(0, BH)
        mh = h < W
        v = tl.load(x_ptr + t * W + h, mask=mh)
        tl.store(out_ptr + row64[:, None] * W + h[None, :], tl.broadcast_to(v[None, :], (KP, BH)),
                 mask=ok[:, None] & mh[None, :])
    if HAS_S:
        _copy_scales(s_ptr, outs_ptr, t, row, WS, KP, BS)


@triton.jit
def _permute_copy_tma(x_ptr, s_ptr, out_desc, outs_ptr, idx_ptr, lrank_ptr, base_ptr, estart_ptr,
                      row_map_ptr, W, WS, E, SB, NC, BW, K: tl.constexpr, KP: tl.constexpr,
                      NB: tl.constexpr, BB: tl.constexpr, HAS_S: tl.constexpr, BS: tl.constexpr):
    """``_permute_copy`` with the K row writes as TMA bulk stores (Hopper+).

    ``out_desc``: host-side descriptor over the output words viewed as [R, NC, BW] (strides
    [W, BW, 1], NC * BW == W), block [1, NB, BB]. The row chunk is loaded once into registers
    (plain loads) and stored to each valid destination row with one descriptor store per row;
    TMA clips the parts of a box past NC / BW, so ragged tails need no mask. Masked slots are
    skipped by a scalar branch (their row is -1, which TMA would also clip, but nothing relies on
    that)."""
    t = tl.program_id(0).to(tl.int64)
    row = _slot_rows(idx_ptr, lrank_ptr, base_ptr, estart_ptr, row_map_ptr, t, E, SB, K, KP)
    ks = tl.arange(0, KP)
    ci0 = tl.arange(0, NB)
    wi0 = tl.arange(0, BB)
    for c0 in range(0, NC, NB):
        ci = c0 + ci0
        for w0 in range(0, BW, BB):
            wi = w0 + wi0
            v = tl.load(x_ptr + t * W + ci[:, None] * BW + wi[None, :],
                        mask=(ci[:, None] < NC) & (wi[None, :] < BW))
            v3 = tl.reshape(v, [1, NB, BB])
            for k in tl.static_range(K):
                rk = tl.sum(tl.where(ks == k, row, 0), 0)     # loop-invariant: hoisted
                if rk >= 0:
                    out_desc.store([rk, c0, w0], v3)
    if HAS_S:
        _copy_scales(s_ptr, outs_ptr, t, row, WS, KP, BS)


@triton.jit
def _zero_pad(out_ptr, outs_ptr, estart_ptr, ecount_ptr, tpe_ptr, W, WS, BH: tl.constexpr,
              HAS_S: tl.constexpr, BS: tl.constexpr):
    e = tl.program_id(0)
    r0 = (tl.load(estart_ptr + e) + tl.load(ecount_ptr + e)).to(tl.int64)
    n_pad = tl.load(tpe_ptr + e) - tl.load(ecount_ptr + e)
    for i in range(0, n_pad):
        r = r0 + i
        for h0 in range(0, W, BH):
            h = h0 + tl.arange(0, BH)
            tl.store(out_ptr + r * W + h, tl.zeros([BH], out_ptr.dtype.element_ty),
                     mask=h < W)
        if HAS_S:
            hs = tl.arange(0, BS)
            tl.store(outs_ptr + r * WS + hs, tl.zeros([BS], outs_ptr.dtype.element_ty),
                     mask=hs < WS)


@triton.jit
def _unpermute(y_ptr, row_map_ptr, w_ptr, out_ptr, H, K: tl.constexpr, KP: tl.constexpr,
               BH: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, KP)
    mk = ks < K
    r = tl.load(row_map_ptr + t * K + ks, mask=mk, other=-1)
    ok = r >= 0
    w = tl.where(ok, tl.load(w_ptr + t * K + ks, mask=mk, other=0).to(tl.float32), 0.0)
    r64 = tl.where(ok, r, 0).to(tl.int64)
    for h0 in range(0, H, BH):
        h = h0 + tl.arange(0, BH)
        mh = h < H
        v = tl.load(y_ptr + r64[:, None] * H + h[None, :], mask=ok[:, None] & mh[None, :], other=0.0)
        acc = tl.sum(v.to(tl.float32) * w[:, None], 0)
        tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=mh)


@triton.jit
def _sort_chunks(x_ptr, out_ptr, sizes_ptr, idxs_ptr, R, W, C, CP: tl.constexpr, BR: tl.constexpr,
                 BH: tl.constexpr):
    c = tl.arange(0, CP)
    mc = c < C
    sizes = tl.load(sizes_ptr + c, mask=mc, other=0)
    in_start = tl.cumsum(sizes, 0) - sizes
    order = tl.load(idxs_ptr + c, mask=mc, other=0)
    out_sizes = tl.load(sizes_ptr + order, mask=mc, other=0)
    out_start = tl.cumsum(out_sizes, 0) - out_sizes
    src_start = tl.gather(in_start, order.to(tl.int32), 0)
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    mr = r < R
    j = tl.sum(((out_start[None, :] <= r[:, None]) & mc[None, :]).to(tl.int32), 1) - 1
    j = tl.maximum(j, 0)
    src = tl.gather(src_start, j, 0) + r - tl.gather(out_start, j, 0)
    for h0 in range(0, W, BH):
        h = h0 + tl.arange(0, BH)
        m = mr[:, None] & (h[None, :] < W)
        v = tl.load(x_ptr + src[:, None] * W + h[None, :], mask=m)
        tl.store(out_ptr + r[:, None] * W + h[None, :], v, mask=m)


# ---------------------------------------------------------------- host side
def _words(t: Tensor) -> Tensor:
    """View a contiguous [N, C] tensor as [N, W] raw words (int32 when the row allows)."""
    b = t.contiguous().view(torch.uint8)
    for dt, size in ((torch.int32, 4), (torch.int16, 2)):
        if b.shape[1] % size == 0:
            return b.view(dt)
    return b


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _slot_block(n_slots: int) -> int:
    return min(4096, max(256, _pow2(-(-n_slots // 128))))


def route(topk_idx_TK: Tensor, num_experts: int, pad_multiple: int, host=None):
    """Launch index kernels. Returns (lrank, base [NB*E], tpe, estart, ecount, total, SB).
    host: (pinned int32 tensor, slot) that also receives the row count."""
    n = topk_idx_TK.numel()
    E = num_experts
    dev = topk_idx_TK.device
    SB = _slot_block(n)
    NB = -(-n // SB)  # triton.cdiv costs microseconds of host time per call
    lrank = torch.empty(n, dtype=torch.int32, device=dev)
    ws = torch.empty(NB * E + 2 * E + 2, dtype=torch.int32, device=dev)
    tpe = torch.empty(E, dtype=torch.int32, device=dev)  # own storage: it is returned
    base = ws[: NB * E]
    estart, ecount = ws[NB * E: NB * E + E], ws[NB * E + E: NB * E + 2 * E]
    total, done = ws[-2:-1], ws[-1:]
    _route_rank[(NB,)](topk_idx_TK, n, E, lrank, base, done, SB=SB, EP=_pow2(E + 1), num_warps=4)
    # one program per 64 experts (a single program for all experts took 16.4 us at E 256 on the
    # H200, 10% of the permute at T 4096)
    host_t, slot = host if host is not None else (total, 0)
    EB = 64
    _route_scan[(-(-E // EB),)](base, NB, E, pad_multiple, tpe, estart, ecount, total, done, host_t,
                                slot, BB=64, EB=EB, HOST=host is not None, num_warps=4)
    return lrank, base, tpe, estart, ecount, total, SB


_TMA_DEVICES: dict = {}


def _tma_device(dev: torch.device) -> bool:
    """TMA descriptors work here: a Hopper+ GPU, or the interpreter (which emulates them)."""
    ok = _TMA_DEVICES.get(dev)
    if ok is None:
        ok = _INTERPRET or (dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9)
        _TMA_DEVICES[dev] = ok
    return ok


def _tma_desc(ow: Tensor, r_max: int, W: int):
    """Descriptor for ``_permute_copy_tma`` over the output words ow [r_max, W], or None when the
    TMA path cannot take the shape (then ``_permute_copy`` runs).

    Box shape: TMA boxes hold at most 256 elements per dimension, so one [1, 256] box over the
    [R, W] row moves only 1 KB. When W is a multiple of 256 words (every benchmark shape: H 2048,
    4096, 7168 in bf16 or fp8), rows are viewed as [R, W / 256, 256] and one box [1, NB, 256] moves
    NB KB (NB = COPY_BH / 256 boxes, so COPY_BH stays the words per chunk, as in the plain kernel);
    a box past W / 256 is clipped by TMA, so W / 256 need not be a multiple of NB. Other rows (a
    multiple of 16 bytes, as TMA strides must be) are viewed as [R, 1, W] and written in boxes of
    [1, 1, <= 256] words, the last one clipped at W. Triton picks the staging buffer's swizzle:
    none up to NB 4 (COPY_BH <= 1024), so a store is one TMA message of up to 4 KB; from NB 8 on
    it picks 128-byte swizzle and splits each store into 8 messages of [1, NB, 32] words (seen in
    the sm_90 PTX). Host-side descriptor rather than ``tl.make_tensor_descriptor``: no per-launch
    scratch allocation through ``triton.set_allocator`` (a context variable, unset in other
    threads) and no per-program descriptor build on the device. Host cost: one
    ``TensorDescriptor`` (about 1 us of Python) here, plus one cuTensorMapEncodeTiled in Triton's
    launcher."""
    if TensorDescriptor is None or ow.dtype != torch.int32 or W <= 0 or W % 4 or ow.data_ptr() % 16:
        return None
    if W % 256 == 0:
        BW, NC, BB = 256, W // 256, 256
        NB = min(1 << (max(1, COPY_BH // 256).bit_length() - 1), _pow2(NC))   # powers of 2
    else:
        BW, NC, BB, NB = W, 1, min(256, _pow2(W)), 1
    return TensorDescriptor(ow, [r_max, NC, BW], [W, BW, 1], [1, NB, BB]), NC, BW, NB, BB


class _HostRing:
    """Pinned int32 slots that the scan kernel writes the row count into (pinned memory is
    mapped into the GPU's address space), one event each, made once per device. The caller
    records the slot's event after the scan, launches the copy, then waits on the event alone:
    no side stream and no device-to-host copy (those cost more host time than the kernels)."""

    SLOTS = 64
    _rings: dict = {}

    @classmethod
    def take(cls, dev: torch.device):
        ring = cls._rings.get(dev)
        if ring is None:
            host = torch.full((cls.SLOTS,), -1, dtype=torch.int32, pin_memory=True)
            ring = cls._rings[dev] = dict(host=host, view=host.numpy(), next=0,
                                          events=[torch.cuda.Event() for _ in range(cls.SLOTS)])
        slot = ring["next"] % cls.SLOTS
        ring["next"] += 1
        return ring, slot


def permute(x_TH: Tensor, topk_idx_TK: Tensor, num_experts: int, scales_TS: Tensor | None,
            pad_multiple: int, num_out_rows: int = -1):
    T, K = topk_idx_TK.shape
    H = x_TH.shape[1]
    E = int(num_experts)
    dev = x_TH.device
    idx = topk_idx_TK.contiguous()
    r_max = T * K + (E * (pad_multiple - 1) if pad_multiple > 0 else 0)
    out = torch.empty((r_max, H), dtype=x_TH.dtype, device=dev)
    out_s = None
    if scales_TS is not None:
        out_s = torch.empty((r_max, scales_TS.shape[1]), dtype=scales_TS.dtype, device=dev)
    row_map = torch.empty((T, K), dtype=torch.int32, device=dev)
    if T * K == 0 or E == 0:
        row_map.fill_(-1)
        tpe = torch.zeros(E, dtype=torch.int32, device=dev)
        return out[:0], (out_s[:0] if out_s is not None else None), row_map, tpe
    ring = None
    if num_out_rows < 0 and dev.type == "cuda":
        ring, slot = _HostRing.take(dev)
    lrank, base, tpe, estart, ecount, total, SB = route(idx, E, pad_multiple,
                                                        (ring["host"], slot) if ring else None)
    if ring:
        ring["events"][slot].record()
    xw, ow = _words(x_TH), _words(out)
    W = xw.shape[1]
    has_s = scales_TS is not None
    sw = _words(scales_TS) if has_s else xw
    osw = _words(out_s) if has_s else ow
    WS = sw.shape[1] if has_s else 0
    BS = _pow2(max(WS, 16))
    BH = min(COPY_BH, _pow2(W))
    tma = _tma_desc(ow, r_max, W) if COPY_TMA and _tma_device(dev) else None
    if tma is not None:
        desc, NC, BW, NB, BB = tma
        _permute_copy_tma[(T,)](xw, sw, desc, osw, idx, lrank, base, estart, row_map, W, WS, E, SB,
                                NC, BW, K=K, KP=_pow2(K), NB=NB, BB=BB, HAS_S=has_s, BS=BS,
                                num_warps=COPY_WARPS)
    else:
        _permute_copy[(T,)](xw, sw, ow, osw, idx, lrank, base, estart, row_map, W, WS, E, SB, K=K,
                            KP=_pow2(K), BH=BH, HAS_S=has_s, BS=BS, num_warps=COPY_WARPS)
    if pad_multiple > 1:
        _zero_pad[(E,)](ow, osw, estart, ecount, tpe, W, WS, BH=BH, HAS_S=has_s, BS=BS,
                        num_warps=4)
    if ring:
        ring["events"][slot].synchronize()
        R = int(ring["view"][slot])
    else:
        R = int(num_out_rows) if num_out_rows >= 0 else int(total.item())
    return out[:R], (out_s[:R] if has_s else None), row_map, tpe


def unpermute(y_RH: Tensor, row_map_TK: Tensor, topk_w_TK: Tensor) -> Tensor:
    T, K = row_map_TK.shape
    H = y_RH.shape[1]
    y = y_RH.contiguous()
    out = torch.empty((T, H), dtype=y.dtype, device=y.device)
    if T == 0 or H == 0:
        return out
    if y.shape[0] == 0:
        return out.zero_()
    BH = min(UNPERM_BH, _pow2(H))
    _unpermute[(T,)](y, row_map_TK.contiguous(), topk_w_TK.contiguous(), out, H, K=K,
                     KP=_pow2(K), BH=BH, num_warps=UNPERM_WARPS)
    return out


def sort_chunks_by_idxs(x_RH: Tensor, split_sizes_C: Tensor, sorted_idxs_C: Tensor) -> Tensor:
    R = x_RH.shape[0]
    out = torch.empty_like(x_RH)
    C = split_sizes_C.numel()
    if R == 0 or x_RH.shape[1] == 0 or C == 0:
        return out
    xw, ow = _words(x_RH), _words(out)
    W = xw.shape[1]
    CP = _pow2(C)
    BR = max(1, min(16, 4096 // CP))
    BH = min(max(16, 4096 // BR), _pow2(W))
    _sort_chunks[(-(-R // BR),)](xw, ow, split_sizes_C.contiguous(), sorted_idxs_C.contiguous(),
                                 R, W, C, CP=CP, BR=BR, BH=BH, num_warps=4)
    return out
