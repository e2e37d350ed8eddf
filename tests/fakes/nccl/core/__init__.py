"""Stub of nccl4py's `nccl.core`: a "communicator" that carries the torch process group it mirrors.

The real `Communicator.init(nranks, rank, unique_id)` (nccl4py 0.6.0 `nccl/core/communicator.py:963`) makes a fresh
NCCL communicator; the fake keeps the gloo group, over which `nccl.ep`'s fake moves tensors.
"""
import torch.distributed as dist


class NcclInvalid(Exception):
    """nccl4py's `nccl.core.typing.NcclInvalid`: the facade raises it for a destroyed Group/Handle."""


class Communicator:
    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.nranks = dist.get_world_size(group)
        self.ptr = id(self)
        self.calls = ["init"]

    def destroy(self):
        self.calls.append("destroy")
        self.ptr = 0
