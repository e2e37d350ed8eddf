"""Fake `nccl.ep.Tensor` (whl `nccl/ep/tensor.py:73-124`): a descriptor over a caller-owned buffer.

Like the real one it keeps the buffer (`.buffer`, the lifetime anchor) and refuses `dtype`/`shape` except with a raw
integer pointer, and `window_offset` without `window`. The fake can only simulate torch tensors: a raw pointer
descriptor is accepted (as the real one) but has no data to move.
"""
from __future__ import annotations

import numbers

import torch

from nccl.core import NcclInvalid

__all__ = ["Tensor"]


class Tensor:
    def __init__(self, buffer, *, dtype=None, shape=None, window=None, window_offset=None) -> None:
        if isinstance(buffer, numbers.Integral) and not isinstance(buffer, bool):
            if dtype is None or shape is None:
                raise ValueError("Raw integer pointer requires `dtype` and `shape` kwargs")
            self._buffer, sizes, self._datatype, self._data = None, tuple(shape), dtype, int(buffer)
        else:
            if dtype is not None or shape is not None:
                raise ValueError("`dtype`/`shape` are only valid with a raw integer pointer")
            if not isinstance(buffer, torch.Tensor):
                raise NcclInvalid(f"Cannot resolve {type(buffer).__name__!r}: the fake takes torch.Tensor only")
            self._buffer, sizes, self._datatype, self._data = buffer, tuple(buffer.shape), buffer.dtype, \
                buffer.data_ptr()
        if not sizes:
            raise ValueError("Tensor requires at least one dimension")
        if window is not None and window_offset is None:
            raise NcclInvalid("`window` requires an explicit `window_offset` (in bytes)")
        if window is None and window_offset is not None:
            raise NcclInvalid("`window_offset` is only valid when `window` is provided")
        self._sizes, self.window, self.window_offset = sizes, window, window_offset

    @property
    def ptr(self) -> int:
        return id(self)

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    @property
    def sizes(self) -> tuple:
        return self._sizes

    @property
    def datatype(self):
        return self._datatype

    @property
    def data(self) -> int:
        return self._data

    @property
    def buffer(self):
        return self._buffer

    def __repr__(self) -> str:
        return f"<Tensor sizes={self._sizes} dtype={self._datatype} data={self._data:#x}>"
