"""A cheaper Triton launch for the ops' kernels: the host path is most of a small op's time.

``kernel[grid](...)`` (``JITFunction.run``) redoes per call what never changes between calls of
one op: it asks for the device and stream, binds and specialises every argument, turns the
options dict into a string key, checks the kernel's globals and builds launch metadata. For the
three permute launches and their torch glue that host time is well above the CUDA impl's one
call, and when the host lags the GPU the timed call waits for it
(docs/decisions.md, "The permute and unpermute defaults").

``launch(fn, grid, num_warps, *args, pdl=False)`` takes every kernel parameter positionally
(constexprs too, in the kernel's order); ``pdl`` compiles the kernel with ``launch_pdl`` (a
programmatic dependent launch: it may start while the kernel before it finishes, and waits for it
in ``gdc_wait``). The first call for a specialisation key goes through
``fn[grid](...)``, which compiles and returns the CompiledKernel; later calls with the same key
call its launcher directly, as ``JITFunction.run`` does at its end. Tensors go in as tensors:
passing their addresses instead, which skips the launcher's per-pointer driver query, is no cheaper
on the host (docs/decisions.md, "The permute and unpermute defaults"). The key holds what Triton
specialises on (tensor dtype and 16-byte alignment; int divisibility by 16, == 1 and the
i32/i64/u64 range; None; constexpr values and their types; num_warps; the device), so a cached
kernel is only reused where Triton would pick the same one (tests/test_triton_launch.py checks
``_spec`` against Triton's own specialisation). It is built with C-level loops (``compress``,
``map``) because it runs on every launch; the launcher, function handle and metadata are cached
with it. Anything else (the interpreter, launch hooks such as a profiler's, an argument of
another kind, e.g. a TMA descriptor) takes the ordinary path.
"""
from __future__ import annotations

import os
from itertools import compress

import torch

try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - Triton < 3.4 keeps its launch hooks elsewhere
    _knobs = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# MOEBENCH_TRITON_DIRECT=0: every launch through fn[grid](...) (the A/B of this module's saving)
_DIRECT = os.environ.get("MOEBENCH_TRITON_DIRECT", "1") != "0"
_cache: dict = {}          # key -> (launcher, function handle, packed metadata) of a CompiledKernel
_params: dict = {}         # fn -> (number of parameters, constexpr mask, non-constexpr mask)
_I32_MIN, _I32_MAX, _U64_MIN = -(1 << 31), (1 << 31) - 1, 1 << 63


def _hook_active(h) -> bool:
    """Triton >= 3.5 keeps launch hooks in a HookChain that is never None: active when it holds a call."""
    return h is not None and bool(getattr(h, "calls", True))


def _hooks_set() -> bool:
    if _knobs is None:  # pragma: no cover
        return True
    rt = _knobs.runtime
    return _hook_active(rt.launch_enter_hook) or _hook_active(rt.launch_exit_hook)


def _spec(a):
    """What Triton specialises a non-constexpr argument on (as its native_specialize_impl does:
    tensor dtype and 16-byte alignment; int divisibility by 16, == 1, i32 / i64 / u64 range; None
    is a constexpr). TypeError for other kinds, which this launcher leaves to Triton."""
    t = type(a)
    if t is int:
        return (a & 15 == 0, a == 1, _I32_MIN <= a <= _I32_MAX, a >= _U64_MIN)
    if t is torch.Tensor:
        return (a.dtype, a.data_ptr() & 15 == 0)
    if a is None or t is bool or t is float:
        return t
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() & 15 == 0)
    raise TypeError(f"no launch key for a {t.__name__}")


def key(fn, num_warps: int, args, device: int = 0, pdl: bool = False) -> tuple:
    """The specialisation key of fn(*args): fn, device, num_warps, pdl, the constexpr values and
    their types (Triton tells 1 from True and 1.0), then ``_spec`` of each other argument."""
    info = _params.get(fn)
    if info is None:
        flags = [p.is_constexpr for p in fn.params]
        info = _params[fn] = (len(flags), flags, [not c for c in flags])
    n, const, other = info
    if len(args) != n:
        raise TypeError(f"{fn.__name__}: {len(args)} arguments for {n} parameters")
    return (fn, device, num_warps, pdl, *compress(args, const), *map(type, compress(args, const)),
            *map(_spec, compress(args, other)))


def _compile_and_launch(fn, grid, num_warps, args, pdl):
    """Triton's own path: fn[grid](*args, num_warps=num_warps[, launch_pdl=True])."""
    if pdl:
        return fn[grid](*args, num_warps=num_warps, launch_pdl=True)
    return fn[grid](*args, num_warps=num_warps)


def launch(fn, grid: tuple, num_warps: int, *args, pdl: bool = False) -> None:
    """fn[grid](*args, num_warps=num_warps[, launch_pdl=True]), launched directly once the kernel
    is compiled."""
    if _INTERPRET or not _DIRECT:
        _compile_and_launch(fn, grid, num_warps, args, pdl)
        return
    dev = torch.cuda.current_device()     # Triton launches on the current device, so do we
    try:
        k = key(fn, num_warps, args, dev, pdl)
    except TypeError:                     # an argument of another kind: Triton's own path
        k = None
    entry = _cache.get(k) if k is not None else None
    if entry is None or _hooks_set():
        kernel = _compile_and_launch(fn, grid, num_warps, args, pdl)
        if hasattr(kernel, "result"):     # an asynchronous compile's future
            kernel = kernel.result()
        if k is not None and kernel is not None:
            run = kernel.run              # a property: loads the module if it is not yet
            _cache[k] = (run, kernel.function, kernel.packed_metadata)
        return
    run, function, metadata = entry
    n = len(grid)
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
        torch._C._cuda_getCurrentRawStream(dev), function, metadata, None, None, None, *args)
