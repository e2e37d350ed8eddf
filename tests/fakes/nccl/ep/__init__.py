"""Fake `nccl.ep` (nccl-extensions 0.1.0 wheel, `nccl/ep/__init__.py`): the same public names, simulated on CPU
over the gloo group of `nccl.ep.interop.torch.get_nccl_comm_from_group`'s communicator.

Simulated: HIGH_THROUGHPUT and LOW_LATENCY with Layout.EXPERT_MAJOR, recipes NONE and FWD (see handle.py).
`get_lib_version()` returns packaging's Version("0.2.0"), as the wheel's library reports (`__init__.py:96-104`).
Environment: FAKE_NCCL_EP_JIT_FAIL=1 fails the kernel compile on every dispatch/combine launch, the way the real
JIT does (stderr line `[nccl_ep jit] fatal ... JIT launch failure for <variant>: compile failed: <log>`, then
`NCCLEpError(3)` = "NCCL EP error code 3"; later launches of the variant fail without the log).
"""
from pathlib import Path as _Path

from nccl._extensions.bindings import nccl_ep as _ep_bindings
from nccl.ep.allocator import AllocConfig, AllocFn, FreeFn
from nccl.ep.enums import (Algorithm, CombineQuantizationRecipe, DispatchQuantizationRecipe, ExpertIdKind, Layout,
                           OverflowPolicy, PassDir, ZeroCopyMode)
from nccl.ep.handle import (CombineConfig, CombineInputs, CombineOutputs, DispatchConfig, DispatchInputs,
                            DispatchOutputs, Handle, HandleConfig, LayoutInfo)
from nccl.ep.group import Group, GroupConfig
from nccl.ep.tensor import Tensor

__all__ = ["Algorithm", "AllocConfig", "AllocFn", "CombineConfig", "CombineInputs", "CombineOutputs",
           "CombineQuantizationRecipe", "DispatchConfig", "DispatchInputs", "DispatchOutputs",
           "DispatchQuantizationRecipe", "ExpertIdKind", "FreeFn", "get_lib_path", "get_lib_version", "Group",
           "GroupConfig", "Handle", "HandleConfig", "Layout", "LayoutInfo", "OverflowPolicy", "PassDir", "Tensor",
           "ZeroCopyMode"]

try:
    from packaging.version import Version as _Version
except ImportError:        # the wheel requires packaging; without it the fake falls back to the text
    _Version = str


def _decode_version(v: int):
    return _Version(f"{v // 10000}.{(v % 10000) // 100}.{v % 100}")


def get_lib_version():
    """Release version of the loaded libnccl_ep.so: 0.2.0 for the 0.1.0 wheel (a packaging Version)."""
    return _decode_version(_ep_bindings.get_version())


def get_lib_path():
    """Path of the (fake) libnccl_ep.so."""
    raw = _ep_bindings.get_library_path()
    return _Path(raw) if raw else None
