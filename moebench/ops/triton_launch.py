"""A cheaper Triton launch for the ops' kernels: the host path is most of a small op's time.

``kernel[grid](...)`` (``JITFunction.run``) redoes per call what never changes between calls of
one op: it asks for the device and stream, binds and specialises every argument, turns the
options dict into a string key, checks the kernel's globals and builds launch metadata. On the
H200 machine the three permute launches and their torch glue took 143-361 us of host time per
call (bench/results/permute-README.md) against 64-128 us for the CUDA impl's one call, and when the
host lags the GPU the timed call waits for it (issue 16 item 3).

``launch(fn, grid, num_warps, *args)`` takes every kernel parameter positionally (constexprs
too, in the kernel's order). The first call for a specialisation key goes through
``fn[grid](...)``, which compiles and returns the CompiledKernel; later calls with the same key
call its launcher directly, as ``JITFunction.run`` does at its end. (Passing tensors as their
addresses instead, which skips the launcher's per-pointer driver query, measured no better on the
H200: host_us 314 vs 174 in two runs, bench/results/permute16-h200-run2.jsonl; reverted.) The key holds what Triton
specialises on (tensor dtype and 16-byte alignment; int divisibility by 16, == 1 and the i32/i64
range; constexpr values; num_warps), so a cached kernel is only reused where Triton would pick the
same one. Anything else (the interpreter, launch hooks such as a profiler's, an argument of
another kind, e.g. a TMA descriptor) takes the ordinary path.
"""
from __future__ import annotations

import os

import torch

try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - Triton < 3.4 keeps its launch hooks elsewhere
    _knobs = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# MOEBENCH_TRITON_DIRECT=0: every launch through fn[grid](...) (the A/B of this module's saving)
_DIRECT = os.environ.get("MOEBENCH_TRITON_DIRECT", "1") != "0"
_cache: dict = {}          # (fn, key) -> CompiledKernel
_constexpr: dict = {}      # fn -> tuple of bools, one per parameter


def _hooks_set() -> bool:
    if _knobs is None:  # pragma: no cover
        return True
    rt = _knobs.runtime
    return rt.launch_enter_hook is not None or rt.launch_exit_hook is not None


def _spec(a, is_constexpr: bool):
    """What Triton specialises one argument on; None when this launcher does not handle it."""
    if is_constexpr:
        return ("c", a)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() & 15 == 0)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return (a & 15 == 0, a == 1, -0x80000000 <= a <= 0x7FFFFFFF)
    if isinstance(a, float):
        return ("f",)
    return None


def key(fn, num_warps: int, args, device: int = 0) -> tuple | None:
    flags = _constexpr.get(fn)
    if flags is None:
        flags = _constexpr[fn] = tuple(p.is_constexpr for p in fn.params)
    if len(flags) != len(args):
        raise TypeError(f"{fn.__name__}: {len(args)} arguments for {len(flags)} parameters")
    spec = tuple(_spec(a, c) for a, c in zip(args, flags))
    return None if None in spec else (device, num_warps) + spec


def launch(fn, grid: tuple, num_warps: int, *args) -> None:
    """fn[grid](*args, num_warps=num_warps), launched directly once the kernel is compiled."""
    if _INTERPRET or not _DIRECT:
        fn[grid](*args, num_warps=num_warps)
        return
    dev = torch.cuda.current_device()     # Triton launches on the current device, so do we
    k = key(fn, num_warps, args, dev)
    kernel = _cache.get((fn, k)) if k is not None else None
    if kernel is None or _hooks_set():
        kernel = fn[grid](*args, num_warps=num_warps)
        if hasattr(kernel, "result"):     # an asynchronous compile's future
            kernel = kernel.result()
        if k is not None and kernel is not None:
            _cache[(fn, k)] = kernel
        return
    stream = torch._C._cuda_getCurrentRawStream(dev)
    kernel.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
               kernel.function, kernel.packed_metadata, None, None, None, *args)
