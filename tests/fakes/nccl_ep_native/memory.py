"""The real structs read back from the addresses the facade passes, and the caller's tensors behind them.

A struct (GroupConfig, DispatchInputs, ...) is the bindings' own class read with `from_ptr` and checked as
EP_VALIDATE_STRUCT checks it (ext `nccl_ep.cc:74-116`: NULL or a wrong magic is ncclInvalidArgument). A tensor field
holds the address of an `ncclEpTensor_t` (wheel `nccl/ep/tensor.py:105-112`: data_, ndim_, datatype, sizes, the
address of ndim_ size_t); `desc` reads it with the checks of tensor_ptr / tensor_required (`nccl_ep.cc:277-315`),
and `Desc.tensor()` is a CPU torch view of the bytes at `data_`: what the fake writes lands in the caller's
tensor. Like the library it reads a dense row-major buffer of `sizes`: the facade keeps data_ptr and shape only
(wheel `tensor.py:28-35`), so a strided tensor is misread here as it would be there.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch
from nccl._extensions.bindings import nccl_ep as bindings

from .failures import DISPATCH, INVALID_ARGUMENT, c_assert, invalid

# ncclDataType_t (nccl4py nccl/core/typing.py:263-303) -> torch
DTYPES = {0: torch.int8, 1: torch.uint8, 2: torch.int32, 3: torch.uint32, 4: torch.int64, 5: torch.uint64,
          6: torch.float16, 7: torch.float32, 8: torch.float64, 9: torch.bfloat16, 10: torch.float8_e4m3fn,
          11: torch.float8_e5m2}
TENSOR_MAGIC = 0xCAFECAFE                                             # NCCL_EP_TENSOR_MAGIC (wheel tensor.py:25)
EP_MAGIC = bindings.DispatchInputs().magic                           # NCCL_EP_MAGIC: every struct the bindings make


def struct(cls, ptr: int, name: str, optional: bool = False):
    """The struct at `ptr` (None for an optional NULL), after EP_VALIDATE_STRUCT's checks."""
    if not ptr:
        if optional:
            return None
        invalid(INVALID_ARGUMENT, f"NCCL EP: required {name} is NULL")
    s = cls.from_ptr(ptr)
    if s.magic != EP_MAGIC:
        invalid(INVALID_ARGUMENT, f"NCCL EP: {name} magic mismatch: got {s.magic:#x}, expected {EP_MAGIC:#x}")
    return s


@dataclass(frozen=True)
class Desc:
    """One ncclEpTensor_t as the library keeps it (tensor_permanent_copy, `nccl_ep.cc:572-584`: the descriptor and
    its sizes, not the data: the data is read where it lies when the library reads it)."""
    data: int
    sizes: tuple[int, ...]
    datatype: int
    win: int = 0                # win_hdl: an NCCL window (zero copy), 0 for a plain device pointer

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.datatype)

    @property
    def row_bytes(self) -> int:
        return self.sizes[-1] * _itemsize(self.dtype)

    def tensor(self) -> torch.Tensor:
        n = math.prod(self.sizes) * _itemsize(self.dtype)
        if n == 0:
            return torch.empty(self.sizes, dtype=self.dtype)
        raw = torch.frombuffer((ctypes.c_uint8 * n).from_address(self.data), dtype=torch.uint8)
        return raw.view(self.dtype).view(self.sizes)


def _itemsize(dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def desc(ptr: int, required: bool = False, func: str = DISPATCH) -> Desc | None:
    """The descriptor at `ptr`: None for NULL unless `required` (tensor_required's assert)."""
    if not ptr:
        c_assert(not required, 312, 't != nullptr && "required tensor field is NULL"', func)
        return None
    t = bindings.Tensor.from_ptr(ptr)
    c_assert(t.magic == TENSOR_MAGIC, 283, 'tensorIsInitialised(t) && "ncclEpTensor_t not initialised — use '
             'NCCL_EP_TENSOR_INIT or ncclEpTensorAlloc"', func)
    sizes = tuple(int(s) for s in (ctypes.c_size_t * t.ndim_).from_address(t.sizes)) if t.ndim_ else ()
    c_assert(0 in sizes or t.data_ or t.win_hdl, 285, '(tensorIsEmpty(t) || tensorHasBinding(t)) && "ncclEpTensor_t '
             'has no storage binding — set `.data` or (`.win_hdl` [+ `.win_offset`])"', func)
    return Desc(int(t.data_), sizes, int(t.datatype), int(t.win_hdl))
