"""`AllocConfig` and the allocator hook types (whl `nccl/ep/allocator.py`); the fake never calls the hooks."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

__all__ = ["AllocConfig", "AllocFn", "FreeFn"]

AllocFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p)
FreeFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


@dataclass
class AllocConfig:
    alloc_fn: int = 0
    free_fn: int = 0
    context: int = 0
