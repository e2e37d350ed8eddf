"""A fake NATIVE layer under the real `nccl.ep` facade (nccl-extensions 0.1.0) and nccl4py's `nccl.core`, for CPU
ranks over gloo.

`install()` replaces, in this process, the functions of the Cython modules the facade calls at call time:
`nccl._extensions.bindings.nccl_ep` (create_group, create_handle, update_handle, dispatch, combine, complete,
handle_destroy, group_destroy, get_version, get_library_path: wheel `nccl/ep/group.py:140,186,199`,
`handle.py:307,346,383,410,415`, `__init__.py:96-104`) and `nccl.bindings.nccl` (libnccl.py). The replacements read
the real structs back from the addresses they are given and the caller's tensors from their descriptors (memory.py),
and simulate NCCL EP over the communicator's gloo group, with the library's checks and failure forms (failures.py).
So the facade's own code runs as on a GPU (its dataclasses, Tensor descriptors, argument order, the unique-id
broadcast of get_nccl_comm_from_group), and a wrong argument fails on CPU as the library would fail it.

Simulated: HIGH_THROUGHPUT, eager (max_recv_tokens_per_rank 0) and with a fixed budget, with and without zero copy
(windows registered on the communicator, GroupConfig.zero_copy ON), and LOW_LATENCY, both with Layout.EXPERT_MAJOR;
dispatch recipes NONE and FWD, combine NONE, forward passes; max_token_bytes as the size of every staged row; the
JIT's compile failure (FAKE_NCCL_EP_JIT_FAIL=1). Not simulated: FLAT and RANK_MAJOR layouts,
backward passes, DS_FP8E3M4 and NVFP4, send_only, LL windows, handle_mem, masks, CUDA streams and graph
capture (the stream argument is ignored), several nodes, OverflowPolicy DROP, the SM count a GPU has.

Every rank process calls `install()` itself (its rank server has not imported this); tests/fakes must be on sys.path.
`registry.CALLS` lists the native calls of this process by binding name, `registry.GROUP_CONFIGS` each GroupConfig
create_group read.
"""
from __future__ import annotations

from pathlib import Path

VERSION_CODE = 200          # libnccl_ep.so of the 0.1.0 wheel: "NCCL EP version 0.2.0" (MAJOR*10000 + MINOR*100)


def install() -> None:
    """Put the fake under the real facade in this process (idempotent)."""
    import nccl.ep.interop.torch as interop
    import torch
    from nccl._extensions.bindings import nccl_ep as ep_bindings
    from nccl.bindings import nccl as nccl_bindings

    from . import group, handle, libnccl, ops
    for fn in (group.create_group, group.group_destroy, handle.create_handle, handle.update_handle,
               handle.handle_destroy, handle.complete, ops.dispatch, ops.combine, get_version, get_library_path):
        setattr(ep_bindings, fn.__name__, fn)
    for fn in libnccl.FUNCTIONS:
        setattr(nccl_bindings, fn.__name__, fn)
    if not torch.cuda.is_available():
        interop.torch = libnccl.CpuTorch()
        from nccl.core.communicator import Communicator    # a CPU rank's buffers are on no device: nothing to match
        Communicator._validate_buffer_device = lambda self, buffer, buffer_name="buffer": None


def get_version() -> int:
    return VERSION_CODE


def get_library_path() -> str:
    import nccl.ep
    return str(Path(nccl.ep.__file__).parent / "lib" / "cu13" / "libnccl_ep.so")
