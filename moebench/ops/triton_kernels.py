"""Triton kernels of permute / unpermute / sort_chunks_by_idxs (the launches are in triton_impl.py).

Permute runs in three launches, no host sync before the copy:
1. ``_route_rank``: slots split in blocks of SB; per block, a sort of (expert, slot) keys gives
   each slot its stable rank among the block's slots of the same expert, and a histogram the
   block's per-expert counts.
2. ``_route_scan``: one program per EB experts (knob ``scan_eb``) turns the [NB, E] counts into
   each block's first row per expert; the last program to finish scans the totals: expert
   starts (padded to ``pad_multiple``), tokens per expert, and the row count (also stored to a
   pinned host slot, so the host waits on one event, not a copy).
3. ``_permute_copy``: one program per token reads its row once and stores it to its K rows
   (row = expert start + block base + rank), writing row_map on the way; fp8 scales and the
   routing probabilities (HAS_P: probs[t, k] to row ``row_map[t, k]``, fp32) ride along.
   ``_permute_copy_tma`` does the same with each row write as a TMA bulk store through a host
   tensor descriptor (Hopper+, rows a multiple of 16 bytes; knob COPY_TMA), else
   ``_permute_copy`` runs. ``_permute_copy_rows`` (knob ``copy_rows`` > 1) takes several tokens
   per program, their row chunks in flight together. With padding, ``_zero_pad`` then zeroes the
   padding rows (payload, scales, probs).
PDL (Hopper+, knob ``pdl``): the scan and the copy are programmatic dependent launches. Each
kernel lets the next one start early (``gdc_launch_dependents``) and the next waits in
``gdc_wait`` until the one before it has finished and its stores are visible, so the launch
latency between the three kernels is hidden. Their profiled times then overlap: the scan's time
includes its wait for the rank kernel.
Payload rows are copied as raw words (int32 when the row is a multiple of 4 bytes; tensors of
4-byte elements, e.g. fp32 scales, as they are), so bf16 and fp8 share one kernel.

The index arrays live in one int32 workspace ``ws`` (one allocation, one pointer argument: each
tensor argument costs the launcher a driver query), at offsets the host passes as ints:
``ws[0:n]`` the slots' ranks, ``ws[B0:B0 + NB*E]`` the per-block counts, then bases,
``ws[S0:S0 + E]`` the expert starts, ``ws[S0 + E:S0 + 2E]`` the expert counts,
``ws[S0 + 2E]`` the row count and ``ws[S0 + 2E + 1]`` the scan's arrival counter.
Absent scales / probs are passed as None (Triton makes them constexpr), not as a dummy tensor.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - Triton < 3.3: no programmatic dependent launch (PDL stays 0)
    gdc_launch_dependents = gdc_wait = None


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



@triton.jit
def _route_rank(idx_ptr, n_slots, E, ws_ptr, B0, S0, SB: tl.constexpr, EP: tl.constexpr,
                PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()   # _route_scan's programs may start now (they wait in gdc_wait)
    lrank_ptr = ws_ptr
    counts_ptr = ws_ptr + B0
    b = tl.program_id(0)
    if b == 0:
        tl.store(ws_ptr + S0 + 2 * E + 1, 0)  # _route_scan's arrival counter
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
def _route_scan(ws_ptr, B0, S0, NB, E, pad, tpe_ptr, host_ptr, slot, BB: tl.constexpr,
                EB: tl.constexpr, EF: tl.constexpr, HOST: tl.constexpr, PDL: tl.constexpr):
    """Program p takes experts [p*EB, (p+1)*EB): counts [NB, E] -> in place, each block's first
    row per expert relative to the expert's start; ecount = totals. The last program to arrive
    scans the padded totals in chunks of EF experts (one chunk up to 4096 experts: this scan is
    the serial tail of the index work): expert starts, tokens per expert and the row count (HOST:
    also to host_ptr[slot], pinned host memory the GPU writes directly)."""
    if PDL:
        gdc_launch_dependents()   # the copy's programs may start (and wait in gdc_wait)
        gdc_wait()                # _route_rank done, its stores visible
    counts_ptr = ws_ptr + B0
    estart_ptr = ws_ptr + S0
    ecount_ptr = estart_ptr + E
    total_ptr = estart_ptr + 2 * E
    done_ptr = total_ptr + 1
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
        carry = tl.sum(tl.zeros([EF], tl.int32), 0)
        for e0 in range(0, E, EF):
            fo = e0 + tl.arange(0, EF)   # own names: eo / me are [EB] above
            mf = fo < E
            tot = tl.load(ecount_ptr + fo, mask=mf, other=0, cache_modifier=".cg")
            padded = tot
            if pad > 0:
                padded = (tot + pad - 1) // pad * pad
            tl.store(tpe_ptr + fo, padded, mask=mf)
            tl.store(estart_ptr + fo, carry + tl.cumsum(padded, 0) - padded, mask=mf)
            carry += tl.sum(padded, 0)
        tl.store(total_ptr, carry)
        if HOST:
            tl.store(host_ptr + slot, carry)


@triton.jit
def _slot_rows(idx_ptr, ws_ptr, B0, S0, row_map_ptr, t, E, SB, K: tl.constexpr, KP: tl.constexpr):
    """Token t's K output rows (expert start + block base + rank; -1 for skipped slots), also
    written to row_map. Padded to KP lanes (-1 past K)."""
    lrank_ptr = ws_ptr
    base_ptr = ws_ptr + B0
    estart_ptr = ws_ptr + S0
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
def _copy_probs(p_ptr, outp_ptr, t, row, K: tl.constexpr, KP: tl.constexpr):
    """Token t's K probabilities to its rows (row >= 0), as fp32."""
    ok = row >= 0
    p = tl.load(p_ptr + t * K + tl.arange(0, KP), mask=ok)
    tl.store(outp_ptr + tl.where(ok, row, 0).to(tl.int64), p.to(tl.float32), mask=ok)


@triton.jit
def _permute_copy(x_ptr, s_ptr, p_ptr, out_ptr, outs_ptr, outp_ptr, idx_ptr, ws_ptr, row_map_ptr,
                  B0, S0, W, WS, E, SB, K: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr,
                  HAS_S: tl.constexpr, HAS_P: tl.constexpr, BS: tl.constexpr, CS: tl.constexpr,
                  PDL: tl.constexpr):
    """CS: streaming access (the row is read once: evict-first load; ".cs" stores)."""
    if PDL:
        gdc_wait()                # _route_scan done
    t = tl.program_id(0).to(tl.int64)
    row = _slot_rows(idx_ptr, ws_ptr, B0, S0, row_map_ptr, t, E, SB, K, KP)
    if HAS_P:
        _copy_probs(p_ptr, outp_ptr, t, row, K, KP)
    ok = row >= 0
    row64 = row.to(tl.int64)
    for h0 in range(0, W, BH):
        h = h0 + tl.arange(0, BH)
        mh = h < W
        dst = out_ptr + row64[:, None] * W + h[None, :]
        m = ok[:, None] & mh[None, :]
        if CS:
            v = tl.load(x_ptr + t * W + h, mask=mh, eviction_policy="evict_first")
            tl.store(dst, tl.broadcast_to(v[None, :], (KP, BH)), mask=m, cache_modifier=".cs")
        else:
            v = tl.load(x_ptr + t * W + h, mask=mh)
            tl.store(dst, tl.broadcast_to(v[None, :], (KP, BH)), mask=m)
    if HAS_S:
        _copy_scales(s_ptr, outs_ptr, t, row, WS, KP, BS)


@triton.jit
def _permute_copy_tma(x_ptr, s_ptr, p_ptr, out_desc, outs_ptr, outp_ptr, idx_ptr, ws_ptr, row_map_ptr,
                      B0, S0, W, WS, E, SB, NC, BW, K: tl.constexpr, KP: tl.constexpr,
                      NB: tl.constexpr, BB: tl.constexpr, HAS_S: tl.constexpr, HAS_P: tl.constexpr,
                      BS: tl.constexpr, PDL: tl.constexpr):
    """``_permute_copy`` with the K row writes as TMA bulk stores (Hopper+).

    ``out_desc``: host-side descriptor over the output words viewed as [R, NC, BW] (strides
    [W, BW, 1], NC * BW == W), block [1, NB, BB]. The row chunk is loaded once into registers
    (plain loads) and stored to each valid destination row with one descriptor store per row;
    TMA clips the parts of a box past NC / BW, so ragged tails need no mask. Masked slots are
    skipped by a scalar branch (their row is -1, which TMA would also clip, but nothing relies on
    that)."""
    if PDL:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    row = _slot_rows(idx_ptr, ws_ptr, B0, S0, row_map_ptr, t, E, SB, K, KP)
    if HAS_P:
        _copy_probs(p_ptr, outp_ptr, t, row, K, KP)
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
def _permute_copy_rows(x_ptr, s_ptr, p_ptr, out_ptr, outs_ptr, outp_ptr, idx_ptr, ws_ptr, row_map_ptr,
                       B0, S0, T, W, WS, E, SB, K: tl.constexpr, KP: tl.constexpr, CT: tl.constexpr,
                       BH: tl.constexpr, HAS_S: tl.constexpr, HAS_P: tl.constexpr, BS: tl.constexpr,
                       CS: tl.constexpr, PDL: tl.constexpr):
    """``_permute_copy`` for CT tokens per program (knob ``copy_rows``): each chunk of the CT rows is
    loaded once as a [CT, BH] tile, CT times the plain kernel's bytes in flight per program, and
    stored to each row's K destinations (one [CT, BH] store per k: the [CT, KP, BH] broadcast would
    hold KP times the registers). The CUDA rows kernel's structure (several whole rows in flight per
    SM) in Triton's terms."""
    if PDL:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64) * CT + tl.arange(0, CT)
    mt = t < T
    ks = tl.arange(0, KP)
    s = t[:, None] * K + ks[None, :]
    ms = mt[:, None] & (ks < K)[None, :]
    e = tl.load(idx_ptr + s, mask=ms, other=-1).to(tl.int32)
    ok = ms & (e >= 0) & (e < E)
    row = (tl.load(ws_ptr + S0 + e, mask=ok, other=0) + tl.load(ws_ptr + B0 + (s // SB) * E + e, mask=ok, other=0)
           + tl.load(ws_ptr + s, mask=ok, other=0))
    row = tl.where(ok, row, -1)
    tl.store(row_map_ptr + s, row, mask=ms)
    if HAS_P:
        p = tl.load(p_ptr + s, mask=ok)
        tl.store(outp_ptr + tl.where(ok, row, 0).to(tl.int64), p.to(tl.float32), mask=ok)
    for h0 in range(0, W, BH):
        h = h0 + tl.arange(0, BH)
        mh = h < W
        src = x_ptr + t[:, None] * W + h[None, :]
        if CS:
            v = tl.load(src, mask=mt[:, None] & mh[None, :], eviction_policy="evict_first")
        else:
            v = tl.load(src, mask=mt[:, None] & mh[None, :])
        for k in tl.static_range(K):
            rk = tl.sum(tl.where(ks[None, :] == k, row, 0), 1)         # [CT], loop-invariant: hoisted
            dst = out_ptr + tl.where(rk >= 0, rk, 0).to(tl.int64)[:, None] * W + h[None, :]
            if CS:
                tl.store(dst, v, mask=(rk >= 0)[:, None] & mh[None, :], cache_modifier=".cs")
            else:
                tl.store(dst, v, mask=(rk >= 0)[:, None] & mh[None, :])
    if HAS_S:
        hs = tl.arange(0, BS)
        ms_ = hs < WS
        sv = tl.load(s_ptr + t[:, None] * WS + hs[None, :], mask=mt[:, None] & ms_[None, :])
        for k in tl.static_range(K):
            rk = tl.sum(tl.where(ks[None, :] == k, row, 0), 1)
            tl.store(outs_ptr + tl.where(rk >= 0, rk, 0).to(tl.int64)[:, None] * WS + hs[None, :], sv,
                     mask=(rk >= 0)[:, None] & ms_[None, :])


@triton.jit
def _zero_pad(out_ptr, outs_ptr, outp_ptr, ws_ptr, S0, tpe_ptr, W, WS, E, BH: tl.constexpr,
              HAS_S: tl.constexpr, HAS_P: tl.constexpr, BS: tl.constexpr):
    """Program e zeroes expert e's padding rows (after its ecount rows, up to its padded count)."""
    e = tl.program_id(0)
    count = tl.load(ws_ptr + S0 + E + e)
    r0 = (tl.load(ws_ptr + S0 + e) + count).to(tl.int64)
    n_pad = tl.load(tpe_ptr + e) - count
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
        if HAS_P:
            tl.store(outp_ptr + r, 0.0)


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
