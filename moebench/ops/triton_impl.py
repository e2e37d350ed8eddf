"""Triton implementation of permute / unpermute / sort_chunks_by_idxs: the host side (launches,
block sizes, TMA descriptors); the kernels and how they work are in triton_kernels.py.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
from torch import Tensor

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton without host-side tensor descriptors (< 3.3)
    TensorDescriptor = None

from .pinned import PinnedRing
from .triton_knobs import DEFAULT_KNOBS, Knobs, knobs  # noqa: F401 - knobs: the variant strings' parser
from .triton_kernels import (
    _permute_copy,
    _permute_copy_rows,
    _permute_copy_tma,
    _route_rank,
    _route_scan,
    _sort_chunks,
    _unpermute,
    _zero_pad,
    gdc_wait,
)
from .triton_launch import launch

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------- host side
def _words(t: Tensor) -> Tensor:
    """A [N, C] tensor's contiguous rows as raw words, [N, W], in one view: int32 when a row is a
    multiple of 4 bytes (a tensor of 4-byte elements as it is), else int16 or uint8."""
    t = t.contiguous()
    es = t.element_size()
    if es == 4:
        return t
    n = t.shape[1] * es
    return t.view(torch.int32 if n % 4 == 0 else torch.int16 if n % 2 == 0 else torch.uint8)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class _Layout(NamedTuple):
    """The index kernels' blocks and the workspace offsets for n slots and E experts (the layout
    is described in triton_kernels.py)."""
    SB: int             # slots per rank block
    NB: int             # rank blocks
    B0: int             # block counts / bases at ws[B0:]
    S0: int             # expert starts, counts, row count, arrival counter at ws[S0:]
    size: int           # workspace words
    EP: int             # the histogram's power-of-2 width (E + 1 buckets: masked slots too)
    EF: int             # experts per chunk of the scan's final pass (all of them up to 4096)
    rank_grid: tuple
    scan_grid: tuple


@functools.lru_cache(maxsize=256)
def _layout(n: int, E: int, rank_sb: int, scan_eb: int) -> _Layout:
    """scan_eb experts per scan program: one program for all experts would make the scan a sizeable
    share of the permute at large E (docs/decisions.md, "The permute and unpermute defaults")."""
    SB = min(4096, max(rank_sb, _pow2(-(-n // 128))))
    NB = -(-n // SB)
    B0 = -(-n // 4) * 4             # the scan's array starts 16-byte aligned
    S0 = B0 + NB * E
    return _Layout(SB, NB, B0, S0, S0 + 2 * E + 2, _pow2(E + 1), min(4096, max(16, _pow2(E))), (NB,),
                   (-(-E // scan_eb),))


def route(idx: Tensor, num_experts: int, pad_multiple: int, host=None, k: Knobs = DEFAULT_KNOBS,
          pdl: bool = False):
    """Launch the index kernels over idx (contiguous [T, K]). Returns (ws, tpe, layout): the int32
    workspace, tokens per expert (own storage: it is returned) and the offsets into ws.
    host: (pinned int32 tensor, slot) that also receives the row count. pdl: the scan is a
    programmatic dependent launch (and lets the next launch be one)."""
    E = num_experts
    lay = _layout(idx.numel(), E, k.rank_sb, k.scan_eb)
    ws = torch.empty(lay.size, dtype=torch.int32, device=idx.device)     # one allocation
    tpe = torch.empty(E, dtype=torch.int32, device=idx.device)
    launch(_route_rank, lay.rank_grid, k.rank_warps, idx, idx.numel(), E, ws, lay.B0, lay.S0, lay.SB, lay.EP,
           pdl)
    host_t, slot = host if host is not None else (None, 0)
    launch(_route_scan, lay.scan_grid, k.scan_warps, ws, lay.B0, lay.S0, lay.NB, E, pad_multiple, tpe,
           host_t, slot, k.scan_bb, k.scan_eb, lay.EF, host is not None, pdl, pdl=pdl)
    return ws, tpe, lay


_HOPPER: dict = {}


def _hopper(dev: torch.device) -> bool:
    """A GPU of compute capability >= 9 (TMA, programmatic dependent launch)."""
    ok = _HOPPER.get(dev)
    if ok is None:
        ok = _HOPPER[dev] = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    return ok


def _tma_device(dev: torch.device) -> bool:
    """TMA descriptors work here: a Hopper+ GPU, or the interpreter (which emulates them)."""
    return _INTERPRET or _hopper(dev)


def _pdl(dev: torch.device, k: Knobs) -> bool:
    """The index and copy kernels chain as programmatic dependent launches here (the interpreter
    has no gdc_wait)."""
    return bool(k.pdl) and gdc_wait is not None and not _INTERPRET and _hopper(dev)


def _tma_desc(ow: Tensor, r_max: int, W: int, copy_bh: int):
    """Descriptor for ``_permute_copy_tma`` over the output words ow [r_max, W], or None when the
    TMA path cannot take the shape (then ``_permute_copy`` runs).

    Box shape: TMA boxes hold at most 256 elements per dimension, so one [1, 256] box over the
    [R, W] row moves only 1 KB. When W is a multiple of 256 words (every benchmark shape: H 2048,
    4096, 7168 in bf16 or fp8), rows are viewed as [R, W / 256, 256] and one box [1, NB, 256] moves
    NB KB (NB = copy_bh / 256 boxes, so copy_bh stays the words per chunk, as in the plain kernel);
    a box past W / 256 is clipped by TMA, so W / 256 need not be a multiple of NB. Other rows (a
    multiple of 16 bytes, as TMA strides must be) are viewed as [R, 1, W] and written in boxes of
    [1, 1, <= 256] words, the last one clipped at W. Triton picks the staging buffer's swizzle:
    none up to NB 4 (copy_bh <= 1024), so a store is one TMA message of up to 4 KB; from NB 8 on
    it picks 128-byte swizzle and splits each store into 8 messages of [1, NB, 32] words (seen in
    the sm_90 PTX). Host-side descriptor rather than ``tl.make_tensor_descriptor``: no per-launch
    scratch allocation through ``triton.set_allocator`` (a context variable, unset in other
    threads) and no per-program descriptor build on the device. Host cost: one
    ``TensorDescriptor`` (about 1 us of Python) here, plus one cuTensorMapEncodeTiled in Triton's
    launcher."""
    if TensorDescriptor is None or ow.element_size() != 4 or W <= 0 or W % 4 or ow.data_ptr() % 16:
        return None
    if W % 256 == 0:
        BW, NC, BB = 256, W // 256, 256
        NB = min(1 << (max(1, copy_bh // 256).bit_length() - 1), _pow2(NC))   # powers of 2
    else:
        BW, NC, BB, NB = W, 1, min(256, _pow2(W)), 1
    return TensorDescriptor(ow, [r_max, NC, BW], [W, BW, 1], [1, NB, BB]), NC, BW, NB, BB


# the row count, written by the scan kernel: the caller records the row's event after the scan, launches
# the copy, then waits on the event alone
_HOST_ROWS = PinnedRing(slots=64, width=1, fill=-1)


@functools.lru_cache(maxsize=256)
def _copy_plan(K: int, W: int, WS: int, k: Knobs):
    """(KP, BH, BS): the copy's slot lanes, words per chunk, scale lanes."""
    return _pow2(K), min(k.copy_bh, _pow2(W)), _pow2(max(WS, 16))


def permute(x_TH: Tensor, topk_idx_TK: Tensor, num_experts: int, scales_TS: Tensor | None,
            pad_multiple: int, num_out_rows: int = -1, variant: str = "", probs_TK: Tensor | None = None):
    """Returns (out_RH, out_scales_RS or None, row_map_TK, tokens_per_expert, probs_R or None);
    probs_R (fp32 [R]) holds probs_TK[t, k] at row row_map[t, k] and 0 on padding rows, written by
    the copy kernel (and ``_zero_pad``), no launch of its own. Host path per call: the index
    kernels, the copy and (padding only) ``_zero_pad``, launched through ``launch``; one view per
    payload tensor; shape-only work cached (``_layout``, ``_copy_plan``)."""
    T, K = topk_idx_TK.shape
    H = x_TH.shape[1]
    E = int(num_experts)
    dev = x_TH.device
    has_s, has_p = scales_TS is not None, probs_TK is not None
    r_max = T * K + (E * (pad_multiple - 1) if pad_multiple > 0 else 0)
    out = torch.empty((r_max, H), dtype=x_TH.dtype, device=dev)
    out_s = torch.empty((r_max, scales_TS.shape[1]), dtype=scales_TS.dtype, device=dev) if has_s else None
    out_p = torch.empty(r_max, dtype=torch.float32, device=dev) if has_p else None
    row_map = torch.empty((T, K), dtype=torch.int32, device=dev)
    if T * K == 0 or E == 0:
        row_map.fill_(-1)
        return (out[:0], out_s[:0] if has_s else None, row_map, torch.zeros(E, dtype=torch.int32, device=dev),
                out_p[:0] if has_p else None)
    idx = topk_idx_TK.contiguous()
    row = _HOST_ROWS.take(dev) if num_out_rows < 0 and dev.type == "cuda" else None
    k = knobs(variant)
    pdl = _pdl(dev, k)
    ws, tpe, lay = route(idx, E, pad_multiple, (row.host, row.offset) if row else None, k, pdl)
    if row:
        row.event.record()
    xw, ow = _words(x_TH), _words(out)
    W = xw.shape[1]
    sw, osw = (_words(scales_TS), _words(out_s)) if has_s else (None, None)
    WS = sw.shape[1] if has_s else 0
    pk = probs_TK.contiguous() if has_p else None
    KP, BH, BS = _copy_plan(K, W, WS, k)
    tma = _tma_desc(ow, r_max, W, k.copy_bh) if k.copy_tma and _tma_device(dev) else None
    if tma is not None:
        desc, NC, BW, NB, BB = tma
        _permute_copy_tma[(T,)](xw, sw, pk, desc, osw, out_p, idx, ws, row_map, lay.B0, lay.S0, W, WS,
                                E, lay.SB, NC, BW, K=K, KP=KP, NB=NB, BB=BB, HAS_S=has_s,
                                HAS_P=has_p, BS=BS, PDL=pdl, num_warps=k.copy_warps, launch_pdl=pdl)
    elif k.copy_rows > 1:
        launch(_permute_copy_rows, (-(-T // k.copy_rows),), k.copy_warps, xw, sw, pk, ow, osw, out_p, idx, ws,
               row_map, lay.B0, lay.S0, T, W, WS, E, lay.SB, K, KP, k.copy_rows, BH, has_s, has_p, BS,
               k.copy_cs, pdl, pdl=pdl)
    else:
        launch(_permute_copy, (T,), k.copy_warps, xw, sw, pk, ow, osw, out_p, idx, ws, row_map,
               lay.B0, lay.S0, W, WS, E, lay.SB, K, KP, BH, has_s, has_p, BS, k.copy_cs, pdl, pdl=pdl)
    if pad_multiple > 1:
        launch(_zero_pad, (E,), 4, ow, osw, out_p, ws, lay.S0, tpe, W, WS, E, BH, has_s, has_p, BS)
    if row:
        row.event.synchronize()
        R = int(row.view[0])
    else:
        R = int(num_out_rows) if num_out_rows >= 0 else int(ws[lay.S0 + 2 * E])
    return out[:R], (out_s[:R] if has_s else None), row_map, tpe, (out_p[:R] if has_p else None)


def unpermute(y_RH: Tensor, row_map_TK: Tensor, topk_w_TK: Tensor, variant: str = "") -> Tensor:
    T, K = row_map_TK.shape
    H = y_RH.shape[1]
    out = torch.empty((T, H), dtype=y_RH.dtype, device=y_RH.device)
    if T == 0 or H == 0:
        return out
    if y_RH.shape[0] == 0:
        return out.zero_()
    k = knobs(variant)
    launch(_unpermute, (T,), k.unperm_warps, y_RH.contiguous(), row_map_TK.contiguous(),
           topk_w_TK.contiguous(), out, H, K, _pow2(K), min(k.unperm_bh, _pow2(H)))
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
    launch(_sort_chunks, (-(-R // BR),), 4, xw, ow, split_sizes_C.contiguous(),
           sorted_idxs_C.contiguous(), R, W, C, CP, BR, BH)
    return out
