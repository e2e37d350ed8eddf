"""CUDA implementation: glue over ``moebench._C`` (csrc/moe_permute.cu + csrc/bindings.cpp).

The extension takes raw device pointers (bindings need only pybind11, so a JIT build takes
seconds, not the minute torch's C++ headers cost); this module owns the tensors. Loading order:
``moebench._C`` built by setup.py, else a JIT build with torch.utils.cpp_extension into
``$MOEBENCH_EXT_DIR`` (default ~/.cache/moebench/ext), else unavailable with the reason.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..env.toolkit import CSRC_DIR, find_nvcc
from . import cuda_variant
from .pinned import PinnedRing

_C = None
_why = "not loaded yet"
CSRC = CSRC_DIR
SOURCES = ("moe_permute.cu", "bindings.cpp")
HEADERS = ("moe_permute.h", "permute_gather.cuh", "permute_index.cuh", "permute_rows.cuh")
# Kernel variants (csrc/moe_permute.h, ops/cuda_variant.py): impl "cuda@V" or "cuda@V:C" picks one per
# call; these are the defaults ("V[:C]" strings, parsed on first use).
# A value that is no variant gives the default here; a tool refuses it before any work (ops.env_problem).
VARIANT_PERMUTE = os.environ.get("MOEBENCH_CUDA_PERMUTE_VARIANT", "") if not cuda_variant.env_problem() else ""
VARIANT_UNPERMUTE = (cuda_variant.parse(os.environ.get("MOEBENCH_CUDA_UNPERMUTE_VARIANT", "")).bits
                     if not cuda_variant.env_problem() else 0)
_DTYPE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
HOST_COUNTS = True    # permute(host_counts=True): tokens per expert on the host before the copy ends


def _jit_build():
    from torch.utils import cpp_extension
    if torch.version.cuda is None:
        raise RuntimeError("torch has no CUDA")
    if find_nvcc() is None:
        raise RuntimeError("nvcc not found (set CUDA_HOME or PATH)")
    srcs = [CSRC / s for s in SOURCES]
    missing = [str(s) for s in srcs if not s.exists()]
    if missing:
        raise RuntimeError(f"sources missing: {missing}")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major == 9 else "")
    h = hashlib.sha1()
    for s in srcs + [CSRC / hdr for hdr in HEADERS]:
        h.update(s.read_bytes())
    h.update(f"{torch.__version__}-{arch}".encode())
    build_dir = Path(os.environ.get("MOEBENCH_EXT_DIR", Path.home() / ".cache/moebench/ext"))
    build_dir = build_dir / h.hexdigest()[:16]
    build_dir.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}" + ("a" if major == 9 else "")
    try:
        return cpp_extension.load(
            name="moebench_C", sources=[str(s) for s in srcs], build_directory=str(build_dir),
            extra_cflags=["-O3"], extra_include_paths=[str(CSRC)],
            extra_cuda_cflags=["-O3", "-std=c++17"],
            verbose=os.environ.get("MOEBENCH_EXT_VERBOSE") == "1")
    finally:
        if old is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def load() -> tuple[bool, str]:
    """Import or JIT-build the extension once; (available, why not)."""
    global _C, _why
    if _C is not None:
        return True, ""
    if _why != "not loaded yet":
        return False, _why
    errors = []
    try:
        from moebench import _C as mod  # built by setup.py
        _C = mod
        return True, ""
    except ImportError as e:
        errors.append(f"moebench._C not built ({e})")
    if os.environ.get("MOEBENCH_JIT", "1") == "0":
        errors.append("JIT disabled by MOEBENCH_JIT=0")
    else:
        try:
            _C = _jit_build()
            return True, ""
        except Exception as e:  # noqa: BLE001 - any build failure means "unavailable, here is why"
            errors.append(f"JIT build failed: {str(e).strip().splitlines()[-1] if str(e).strip() else e!r}")
    _why = "; ".join(errors)
    return False, _why


def _stream(dev: torch.device) -> int:
    # the raw handle, as Triton's launcher gets it: torch.cuda.current_stream() builds a Stream object
    return torch._C._cuda_getCurrentRawStream(dev.index if dev.index is not None else torch.cuda.current_device())


def _up4(n: int) -> int:
    return (n + 3) & ~3


_WS: dict = {}    # (slots, experts, padding) -> workspace int32 words


def _ws_words(n: int, E: int, pad: int) -> int:
    w = _WS.get((n, E, pad))
    if w is None:
        w = _WS[(n, E, pad)] = _up4(-(-_C.workspace_bytes(n, E, pad) // 4))
    return w


_SMEM: dict = {}     # device -> shared memory per block (opt-in)
_CODES: dict = {}    # (variant, row bytes, K, E, x aligned, device) -> moe_permute's variant int


def _smem_optin(dev: torch.device) -> int:
    v = _SMEM.get(dev)
    if v is None:
        props = torch.cuda.get_device_properties(dev)
        v = _SMEM[dev] = int(getattr(props, "shared_memory_per_block_optin", 0) or cuda_variant.HOPPER_SMEM_OPTIN)
    return v


def _permute_code(variant: str, row_bytes: int, K: int, E: int, aligned: bool, dev: torch.device) -> int:
    """The variant int for moe_permute, resolved once per shape: an explicit rows-per-CTA the rows
    kernel cannot take at this shape (cuda_variant.rows_problem, or x not 16-byte aligned) falls
    back to the default (auto) with a warning, never to a failed launch."""
    key = (variant, row_bytes, K, E, aligned, dev)
    code = _CODES.get(key)
    if code is None:
        v = cuda_variant.parse(variant)
        if v.rows and v.rows_kernel:
            why = (cuda_variant.rows_problem(v.rows, row_bytes, K, E, _smem_optin(dev))
                   or ("" if aligned else "x is not 16-byte aligned"))
            if why:
                warnings.warn(f"cuda@{variant}: {why}; running it with the default rows per CTA", stacklevel=5)
                v = v._replace(rows=0)
        code = _CODES[key] = v.code
    return code


E_MAX = 4096                     # the CUDA kernels' expert limit (larger E goes to Triton)
# tokens per expert, written by the scan kernel: the host reads them once the index kernels are done,
# while the copy still runs
_HOST_COUNTS = PinnedRing(slots=16, width=E_MAX)


def permute(x_TH: Tensor, topk_idx_TK: Tensor, num_experts: int, scales_TS: Tensor | None,
            pad_multiple: int, num_out_rows: int = -1, variant: str = "", probs_TK: Tensor | None = None,
            host_counts: bool = False):
    """host_counts: also return tokens per expert as a host list (6th value), read from pinned memory
    the scan kernel writes, so the host waits for the index kernels only, not for the copy."""
    T, K = topk_idx_TK.shape
    E = int(num_experts)
    if K > 32 or E > E_MAX or K == 0 or E == 0:
        from . import triton_impl  # outside the CUDA kernels' limits
        res = triton_impl.permute(x_TH, topk_idx_TK, E, scales_TS, pad_multiple, num_out_rows, "", probs_TK)
        return (*res, res[3].tolist()) if host_counts else res
    x = x_TH.contiguous()
    idx = topk_idx_TK.contiguous()
    if idx.dtype not in (torch.int32, torch.int64):
        idx = idx.long()
    dev = x.device
    pad = pad_multiple if pad_multiple > 1 else 0
    r_max = T * K + E * max(pad - 1, 0)
    out = torch.empty((r_max, x.shape[1]), dtype=x.dtype, device=dev)
    s = out_s = None
    if scales_TS is not None:
        s = scales_TS.contiguous()
        out_s = torch.empty((r_max, s.shape[1]), dtype=s.dtype, device=dev)
    p = None if probs_TK is None else (probs_TK if probs_TK.dtype == torch.float32 else probs_TK.float()).contiguous()
    # the workspace rides in row_map's allocation, 16-byte aligned (each allocation costs microseconds
    # of host time); the outputs keep their own storage (a custom op's outputs must not alias)
    n = T * K
    o_ws = _up4(n)
    meta = torch.empty(o_ws + _ws_words(n, E, pad), dtype=torch.int32, device=dev)
    row_map = meta[:n].view(T, K)
    tpe = torch.empty(E, dtype=torch.int32, device=dev)
    out_p = torch.empty(r_max, dtype=torch.float32, device=dev) if p is not None else None
    wait = 1 if (num_out_rows < 0 or host_counts) else 0
    row = _HOST_COUNTS.take(dev) if host_counts else None
    host_ptr = row.host.data_ptr() + 4 * row.offset if row else 0
    rb = x.shape[1] * x.element_size()
    variant = variant or VARIANT_PERMUTE or (cuda_variant.FP8_DEFAULT if s is not None else "")
    code = _permute_code(variant, rb, K, E, x.data_ptr() % 16 == 0, dev)
    R = _C.permute(x.data_ptr(), rb,
                   s.data_ptr() if s is not None else 0,
                   s.shape[1] * s.element_size() if s is not None else 0,
                   idx.data_ptr(), idx.element_size(), T, K, E, pad, out.data_ptr(),
                   out_s.data_ptr() if out_s is not None else 0, row_map.data_ptr(), tpe.data_ptr(),
                   p.data_ptr() if p is not None else 0, out_p.data_ptr() if p is not None else 0,
                   meta.data_ptr() + 4 * o_ws, wait, host_ptr, code, _stream(dev))
    if not wait:
        R = int(num_out_rows)
    if R != r_max:
        out = out[:R]
        out_s = out_s[:R] if out_s is not None else None
        out_p = out_p[:R] if out_p is not None else None
    if host_counts:
        return out, out_s, row_map, tpe, out_p, row.view[:E].tolist()
    return out, out_s, row_map, tpe, out_p


def unpermute(y_RH: Tensor, row_map_TK: Tensor, topk_w_TK: Tensor, variant: str = "") -> Tensor:
    T, K = row_map_TK.shape
    y = y_RH.contiguous()
    H = y.shape[1]
    if y.dtype not in _DTYPE or K > 32:
        from . import triton_impl
        return triton_impl.unpermute(y_RH, row_map_TK, topk_w_TK)
    w = topk_w_TK.contiguous()
    if w.dtype not in _DTYPE:
        w = w.float()
    rm = row_map_TK if row_map_TK.dtype == torch.int32 else row_map_TK.to(torch.int32)
    rm = rm.contiguous()
    out = torch.empty((T, H), dtype=y.dtype, device=y.device)
    if y.shape[0] == 0:
        return out.zero_()
    _C.unpermute(y.data_ptr(), _DTYPE[y.dtype], rm.data_ptr(), w.data_ptr(), _DTYPE[w.dtype],
                 out.data_ptr(), T, K, H, cuda_variant.parse(variant).bits if variant else VARIANT_UNPERMUTE,
                 _stream(y.device))
    return out


def sort_chunks_by_idxs(x_RH: Tensor, split_sizes_C: Tensor, sorted_idxs_C: Tensor) -> Tensor:
    x = x_RH.contiguous()
    out = torch.empty_like(x)
    C = split_sizes_C.numel()
    if C > 2048:
        from . import triton_impl
        return triton_impl.sort_chunks_by_idxs(x_RH, split_sizes_C, sorted_idxs_C)
    sizes = split_sizes_C.to(torch.int64).contiguous()
    idxs = sorted_idxs_C.to(torch.int64).contiguous()
    if x.shape[0] == 0 or C == 0:
        return out
    _C.sort_chunks(x.data_ptr(), x.shape[1] * x.element_size(), x.shape[0], sizes.data_ptr(),
                   idxs.data_ptr(), C, out.data_ptr(), _stream(x.device))
    return out
