"""Fake of `nccl.ep.interop.torch` (wheel `interop/torch.py:30-77`).

The real `get_nccl_comm_from_group` always makes a FRESH NCCL communicator mirroring the group (rank 0's unique id
is broadcast over the group, then `Communicator.init` on the current CUDA device): it is collective. The fake does a
broadcast over the (gloo) group too, and returns an `nccl.core.Communicator` that carries the group.
"""
from __future__ import annotations

import nccl.core as _nccl_core

try:
    import torch
    import torch.distributed as dist

    _torch_enabled = True
except ImportError:
    _torch_enabled = False

__all__ = ["get_nccl_comm_from_group"]


def get_nccl_comm_from_group(group=None) -> _nccl_core.Communicator:
    if not _torch_enabled:
        raise ModuleNotFoundError("PyTorch is not installed")
    if group is not None:
        src = dist.get_process_group_ranks(group)[0]
    elif dist.is_initialized():
        src = 0
    else:
        raise RuntimeError(
            "PyTorch distributed is not initialized. "
            "Call torch.distributed.init_process_group(...) first."
        )
    uid = torch.zeros(128, dtype=torch.uint8)         # the unique id's bytes, as the real one broadcasts them
    dist.broadcast(uid, src=src, group=group)
    return _nccl_core.Communicator(group)
