"""MoE permute / unpermute / sort-chunks as ``torch.library`` ops with torch, Triton and CUDA impls.

Legend: T tokens, H hidden, K top-k, E experts, R permuted rows, S scale columns, C chunks.

Why this shape:
- One schema per op in the ``moebench`` namespace (``torch.ops.moebench.permute`` etc.); the
  implementation is a string argument (``impl``: "torch" | "triton" | "cuda", and for tuning
  "cuda@V[:C]" / "triton@BH:WARPS:UBH:UWARPS:TMA:...", see cuda_variant / triton_impl), so a benchmark or a
  backend can pick one per call (no module-global knob state), and ``torch.library.opcheck`` covers all of them. The ops are
  registered with ``Library.define``/``impl`` (CPU and CUDA keys plus a fake kernel), not
  ``@custom_op``, whose per-call overhead is several microseconds.
- The torch implementation (``torch_impl.py``) is the oracle and the CPU implementation.
- ``permute`` returns rows in Megatron-Core's unfused ``permute`` order (by expert, then token
  index; -1 slots skipped). Its row count depends on the data, so the GPU impls compute the index
  math on the device, launch the copy into an upper-bound buffer, and only then wait for the row
  count (the copy keeps the GPU busy meanwhile). Pass ``num_out_rows`` when the caller already
  knows it (e.g. from the all-to-all splits): then nothing waits for the device. ``probs_TK``
  (routing weights) are permuted by the same launch, where each slot's row is known anyway.
- The CUDA impl lives in ``moebench._C`` (built by setup.py, or JIT-built into a cache on first
  GPU use); when it cannot be loaded, ``best_impl`` falls back to Triton and ``impl_status`` says why.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor

from . import torch_impl

IMPLS = ("torch", "triton", "cuda")
# moebench's own kernels as the profiler names them: the CUDA extension's (in an anonymous namespace, csrc/) and the
# Triton ones (ops/triton_kernels.py), checked against the sources by a test; a timed phase's kernels are split
# into the library's, moebench's and torch's by them (harness/views/profile.py)
CUDA_KERNELS = ("gather_index_kernel", "permute_bulk_kernel", "permute_copy_kernel", "permute_gather_kernel",
                "permute_rows_kernel", "route_rank_kernel", "route_scan_kernel", "sort_chunks_kernel",
                "unpermute_kernel", "zero_pad_kernel")
TRITON_KERNELS = ("_route_rank", "_route_scan", "_permute_copy", "_permute_copy_tma", "_permute_copy_rows",
                  "_zero_pad", "_unpermute", "_sort_chunks")


class Permuted(NamedTuple):
    x_RH: Tensor                 # rows grouped by expert (Megatron order); padding rows zero-filled
    scales_RS: Tensor | None     # fp8 payload scales permuted the same way (None for bf16)
    row_map_TK: Tensor           # int32 [T, K]: output row of slot (t, k); -1 for masked slots
    tokens_per_expert: Tensor    # int32 [E] on x's device (padded counts when pad_multiple > 0)
    probs_R: Tensor | None = None  # fp32 [R]: probs[t, k] at row row_map[t, k] (0 on padding rows)
    tokens_per_expert_host: list[int] | None = None   # the same counts on the host (counts_to_host)


# ---------------------------------------------------------------- implementation registry
_status: dict[str, tuple[bool, str]] = {}


def _check_triton() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the environment
        return False, f"triton not importable: {e}"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run the Triton kernels on CPU)"
    return True, ""


def _check_cuda() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    from . import cuda_impl
    return cuda_impl.load()


def impl_status() -> dict[str, tuple[bool, str]]:
    """Per impl: (available, why not). May JIT-build the CUDA extension on first call."""
    if "torch" not in _status:
        _resolved.clear()
        _status["torch"] = (True, "")
        _status["triton"] = _check_triton()
        _status["cuda"] = _check_cuda()
    return dict(_status)


def _available(name: str) -> tuple[bool, str]:
    """impl_status()[name] without copying the table (this runs on every op call)."""
    if name not in _status:
        impl_status()
    return _status[name]


# Fastest first, per op, side by side on Hopper: CUDA's permute is ahead of Triton's (by a few
# percent once the Triton launch is direct), Triton's unpermute ahead of CUDA's, also inside the EP 1
# combine (docs/decisions.md, "The permute and unpermute defaults").
PREFERENCE = {"permute": ("cuda", "triton"), "unpermute": ("triton", "cuda"),
              "sort_chunks_by_idxs": ("cuda", "triton")}


def best_impl(device, op: str = "permute") -> str:
    """Fastest implementation of ``op`` available on ``device`` (PREFERENCE); CPU -> "torch"."""
    if torch.device(device).type != "cuda":
        return "torch"
    for name in PREFERENCE[op]:
        if _available(name)[0]:
            return name
    return "torch"


_resolved: dict = {}      # (impl, device type, op) -> (module, variant): resolved once, used per call


def _backend(impl: str, device: torch.device, op: str):
    """(implementation module, variant) for "NAME" or "NAME@VARIANT" (cuda@16, triton@2048:8)."""
    key = (impl, device.type, op)
    hit = _resolved.get(key)
    if hit is not None:
        return hit
    name, _, variant = impl.partition("@")
    if variant and op == "sort_chunks_by_idxs":
        raise ValueError(f"impl {name!r} has no variants for {op} (only cuda@V and triton@... permute/unpermute)")
    if variant:
        check_variant(name, variant)
    hit = _resolved[key] = (_module(name, device, op), variant)
    return hit


VARIANT_IMPLS = ("cuda", "triton")     # the impls that take NAME@VARIANT (permute / unpermute)


def check_variant(name: str, variant: str) -> None:
    """Refuse a malformed variant with its reason when the impl string is resolved (once per impl,
    on any machine, the GPU or not), never at a launch. The CUDA permute's rows-per-CTA against a
    shape's shared memory is checked per shape (cuda_impl: falls back with a warning). Only cuda and triton
    take a variant ('' is their default)."""
    if name not in VARIANT_IMPLS:
        raise ValueError(f"{name}@{variant}: {name} has no variants (only cuda@V and triton@... take one)")
    if name == "cuda":
        from . import cuda_variant
        cuda_variant.parse(variant)
        return
    try:
        from . import triton_impl
    except ImportError:  # pragma: no cover - no Triton here: _module says so
        return
    triton_impl.knobs(variant)


def env_problem(environ=None) -> str:
    """'' or one line naming an environment variable that sets the kernels' defaults (MOEBENCH_TRITON_<KNOB>,
    MOEBENCH_CUDA_PERMUTE_VARIANT, MOEBENCH_CUDA_UNPERMUTE_VARIANT) and holds no valid value. Tools refuse it
    before any work: read inside the ranks, it made FAIL rows that blamed the kernels."""
    from . import cuda_variant, triton_knobs
    try:
        triton_knobs.env_knobs(environ)
    except ValueError as e:
        return str(e)
    return cuda_variant.env_problem(environ)


def _module(impl: str, device: torch.device, op: str):
    if impl == "auto":
        impl = best_impl(device, op)
    if impl == "torch":
        return torch_impl
    if impl == "triton":
        ok, why = _available("triton")
        if not ok:
            raise RuntimeError(f"impl 'triton' unavailable: {why}")
        from . import triton_impl
        return triton_impl
    if impl == "cuda":
        if device.type != "cuda":
            raise RuntimeError("impl 'cuda' needs CUDA tensors")
        ok, why = _available("cuda")
        if not ok:
            raise RuntimeError(f"impl 'cuda' unavailable: {why}")
        from . import cuda_impl
        return cuda_impl
    raise ValueError(f"unknown impl {impl!r}; known: auto, {', '.join(IMPLS)}")


# ---------------------------------------------------------------- torch.library registration
_lib = torch.library.Library("moebench", "FRAGMENT")
_lib.define("permute(Tensor x, Tensor topk_idx, int num_experts, Tensor? scales, int pad_multiple, "
            "int num_out_rows, str impl, Tensor? probs=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
_lib.define("unpermute(Tensor y, Tensor row_map, Tensor topk_w, str impl) -> Tensor")
_lib.define("sort_chunks_by_idxs(Tensor x, Tensor split_sizes, Tensor sorted_idxs, str impl) -> Tensor")


def _permute_impl(x, topk_idx, num_experts, scales, pad_multiple, num_out_rows, impl, probs=None,
                  host_counts=False):
    """(out, out_s or None, row_map, tpe, out_p or None[, tpe as a host list]) from the chosen
    implementation; the CUDA one delivers the host counts before its copy ends, the others after."""
    mod, variant = _backend(impl, x.device, "permute")
    args = (x, topk_idx, num_experts, scales, pad_multiple, num_out_rows, variant, probs)
    if not host_counts:
        return mod.permute(*args)
    if getattr(mod, "HOST_COUNTS", False):
        return mod.permute(*args, host_counts=True)
    res = mod.permute(*args)
    return (*res, res[3].tolist())


def _permute_kernel(x, topk_idx, num_experts, scales, pad_multiple, num_out_rows, impl, probs=None):
    """The registered op: a schema has no optional outputs, so absent ones are empty fp32 tensors."""
    out, out_s, row_map, tpe, out_p = _permute_impl(x, topk_idx, num_experts, scales, pad_multiple,
                                                    num_out_rows, impl, probs)
    none = lambda t: torch.empty(0, dtype=torch.float32, device=x.device) if t is None else t  # noqa: E731
    return out, none(out_s), row_map, tpe, none(out_p)


def _unpermute_kernel(y, row_map, topk_w, impl):
    mod, variant = _backend(impl, y.device, "unpermute")
    return mod.unpermute(y, row_map, topk_w, variant) if variant else mod.unpermute(y, row_map, topk_w)


def _sort_chunks_kernel(x, split_sizes, sorted_idxs, impl):
    return _backend(impl, x.device, "sort_chunks_by_idxs")[0].sort_chunks_by_idxs(x, split_sizes, sorted_idxs)


for _key in ("CPU", "CUDA"):
    _lib.impl("permute", _permute_kernel, _key)
    _lib.impl("unpermute", _unpermute_kernel, _key)
    _lib.impl("sort_chunks_by_idxs", _sort_chunks_kernel, _key)


@torch.library.register_fake("moebench::permute", lib=_lib)
def _permute_fake(x, topk_idx, num_experts, scales, pad_multiple, num_out_rows, impl, probs=None):
    R = num_out_rows if num_out_rows >= 0 else torch.library.get_ctx().new_dynamic_size()
    out = x.new_empty((R, x.shape[1]))
    out_s = (scales.new_empty((R, scales.shape[1])) if scales is not None
             else x.new_empty((0,), dtype=torch.float32))
    row_map = topk_idx.new_empty(topk_idx.shape, dtype=torch.int32)
    tpe = x.new_empty((num_experts,), dtype=torch.int32)
    out_p = x.new_empty((R if probs is not None else 0,), dtype=torch.float32)
    return out, out_s, row_map, tpe, out_p


@torch.library.register_fake("moebench::unpermute", lib=_lib)
def _unpermute_fake(y, row_map, topk_w, impl):
    return y.new_empty((row_map.shape[0], y.shape[1]))


@torch.library.register_fake("moebench::sort_chunks_by_idxs", lib=_lib)
def _sort_chunks_fake(x, split_sizes, sorted_idxs, impl):
    return torch.empty_like(x)


# ---------------------------------------------------------------- public API
def _op(registered, kernel):
    """The registered op under torch.compile / export; the kernel itself in eager mode, which
    skips the dispatcher's round trip: host time per call matters when the op is host-bound."""
    return registered if torch.compiler.is_compiling() else kernel


def permute(x_TH: Tensor, topk_idx_TK: Tensor, num_experts: int, *, scales_TS: Tensor | None = None,
            pad_multiple: int = 0, impl: str = "auto", num_out_rows: int | None = None,
            probs_TK: Tensor | None = None, counts_to_host: bool = False) -> Permuted:
    """Group token rows by expert (Megatron order). ``num_out_rows``: the caller's known row count
    (padded count when pad_multiple > 0); skips the wait for the device to count rows.
    ``probs_TK``: routing weights [T, K], permuted with the rows in the same launch (``probs_R``, fp32),
    as Transformer Engine's ``moe_permute_with_probs`` does; no separate scatter.
    ``counts_to_host``: also ``tokens_per_expert_host`` (a list), the one host sync of the call; the
    exact row count then comes with it (``num_out_rows`` is not needed)."""
    if x_TH.dim() != 2 or topk_idx_TK.dim() != 2 or x_TH.shape[0] != topk_idx_TK.shape[0]:
        raise ValueError(f"want x [T, H] and topk_idx [T, K]; got {tuple(x_TH.shape)}, "
                         f"{tuple(topk_idx_TK.shape)}")
    if scales_TS is not None and scales_TS.shape[0] != x_TH.shape[0]:
        raise ValueError("scales_TS must have one row per token")
    if probs_TK is not None:
        if probs_TK.shape != topk_idx_TK.shape:
            raise ValueError(f"probs_TK {tuple(probs_TK.shape)} must match topk_idx {tuple(topk_idx_TK.shape)}")
        probs_TK = probs_TK.float()
    n_out = -1 if num_out_rows is None else int(num_out_rows)
    if torch.compiler.is_compiling():
        res = torch.ops.moebench.permute(x_TH, topk_idx_TK, int(num_experts), scales_TS, int(pad_multiple),
                                         n_out, impl, probs_TK)
        res = (*res, res[3].tolist() if counts_to_host else None)
    else:
        res = _permute_impl(x_TH, topk_idx_TK, int(num_experts), scales_TS, int(pad_multiple), n_out, impl,
                            probs_TK, counts_to_host)
    out, out_s, row_map, tpe, out_p = res[:5]
    return Permuted(out, out_s if scales_TS is not None else None, row_map, tpe,
                    out_p if probs_TK is not None else None, res[5] if counts_to_host else None)


_UNIT: dict = {}     # (shape, device) -> unit weights: an unweighted unpermute is the weighted kernel times 1.0 (exact)


def unpermute(y_RH: Tensor, row_map_TK: Tensor, topk_w_TK: Tensor | None, *, impl: str = "auto") -> Tensor:
    """out[t] = sum_k w[t,k] * y[row_map[t,k]] over row_map >= 0, fp32 accumulation, y's dtype. topk_w_TK None: the
    unweighted sum Megatron's combine is (its experts applied the probs), by the same kernel with unit weights (kept
    per shape and device, so no call fills them)."""
    if topk_w_TK is None:
        key = (tuple(row_map_TK.shape), row_map_TK.device)
        if key not in _UNIT:
            if len(_UNIT) >= 16:        # a sweep's shapes: keep a few
                _UNIT.clear()
            _UNIT[key] = torch.ones(row_map_TK.shape, dtype=torch.float32, device=row_map_TK.device)
        topk_w_TK = _UNIT[key]
    if row_map_TK.shape != topk_w_TK.shape:
        raise ValueError(f"row_map {tuple(row_map_TK.shape)} and topk_w {tuple(topk_w_TK.shape)} differ")
    return _op(torch.ops.moebench.unpermute, _unpermute_kernel)(y_RH, row_map_TK, topk_w_TK, impl)


def sort_chunks_by_idxs(x_RH: Tensor, split_sizes, sorted_idxs, *, impl: str = "auto") -> Tensor:
    """Megatron semantics: split x into chunks of split_sizes, concatenate them in sorted_idxs order.
    split_sizes / sorted_idxs: int tensors (any device) or lists; sum(split_sizes) must be R."""
    dev = x_RH.device
    split_sizes = torch.as_tensor(split_sizes, dtype=torch.int64).to(dev, non_blocking=True)
    sorted_idxs = torch.as_tensor(sorted_idxs, dtype=torch.int64).to(dev, non_blocking=True)
    return _op(torch.ops.moebench.sort_chunks_by_idxs, _sort_chunks_kernel)(
        x_RH, split_sizes, sorted_idxs, impl)


__all__ = ["Permuted", "permute", "unpermute", "sort_chunks_by_idxs", "best_impl", "impl_status", "check_variant",
           "IMPLS"]
