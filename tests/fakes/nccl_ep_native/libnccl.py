"""libnccl as nccl4py 0.6.0 reaches it (`nccl.bindings.nccl`, the Cython module), as far as the real `nccl.core`
needs it for `nccl.ep.interop.torch.get_nccl_comm_from_group` (wheel `interop/torch.py:30-77`),
`Communicator.destroy` and the windows of NCCL EP's zero copy: get_unique_id, comm_init_rank_scalable (what
`Communicator.init` calls, nccl4py `core/communicator.py:1087`; destroy: `:1290-1317`), comm_count, comm_user_rank,
comm_destroy, comm_window_register (collective: every rank registers; a symmetric window the same size on each) and
comm_window_deregister (`core/resources.py:274-290`).

A communicator is this process's torch world group (the CPU ranks of run_ranks, over gloo): one of another size or
rank order is refused. The facade broadcasts rank 0's unique id over the group (kept real); the fake checks what
real NCCL would hang on: every rank brings that same id.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from gloo_bytes import gather
from nccl.bindings import nccl as bindings

from .failures import unsupported
from .registry import lookup, new_ptr, recorded, release

UID_PREFIX = b"fake-nccl-uid:"


@dataclass
class Comm:
    nranks: int
    rank: int
    group: object = None            # torch.distributed's world group


@recorded
def get_unique_id():
    return bindings.UniqueId.from_buffer(UID_PREFIX + os.urandom(128 - len(UID_PREFIX)))


@recorded
def comm_init_rank_scalable(nranks, rank, nids, comm_ids, config_ptr):
    unsupported(nids == 1 and not config_ptr, "one unique id and no ncclConfig_t")
    unsupported(dist.is_initialized() and nranks == dist.get_world_size() and rank == dist.get_rank(),
                f"a communicator of the torch world group only (rank {rank} of {nranks})")
    uids = gather(None, bytes(comm_ids))
    if len(set(uids)) != 1 or not uids[0].startswith(UID_PREFIX):
        raise RuntimeError("fake libnccl: the ranks brought different unique ids (the real ncclCommInitRank waits "
                           "for ever): was rank 0's id broadcast?")
    return bindings.Comm(new_ptr(Comm(nranks, rank)))


def comm_of(ptr: int) -> Comm:
    return lookup(ptr, Comm, "ncclComm_t")


@recorded
def comm_count(comm):
    return comm_of(comm.handle).nranks


@recorded
def comm_user_rank(comm):
    return comm_of(comm.handle).rank


@recorded
def comm_destroy(comm):
    comm_of(comm.handle)
    release(comm.handle)


@dataclass
class Window:
    comm: Comm
    ptr: int
    size: int
    flags: int


COLL_SYMMETRIC = 0x01


@recorded
def comm_window_register(comm, buff, size, win_flags):
    c = comm_of(comm.handle)
    sizes = gather(None, int(size))
    if win_flags & COLL_SYMMETRIC and len(set(sizes)) != 1:
        raise RuntimeError(f"fake libnccl: a symmetric window of different sizes on the ranks ({sizes}): the real "
                           "registration fails or corrupts peers' views")
    return bindings.Window(new_ptr(Window(c, int(buff), int(size), int(win_flags))))


@recorded
def comm_window_deregister(comm, win):
    window_of(win.handle)
    release(win.handle)


def window_of(ptr: int) -> Window:
    return lookup(ptr, Window, "ncclWindow_t")


FUNCTIONS = (get_unique_id, comm_init_rank_scalable, comm_count, comm_user_rank, comm_destroy, comm_window_register,
             comm_window_deregister)


class _CpuCuda:
    """What get_nccl_comm_from_group asks of torch.cuda (wheel `interop/torch.py:60,76`) on a CPU-only torch, which
    has no current device: -1, torch's "no device" (`torch.cuda.device(-1)` is a no-op)."""
    device = staticmethod(torch.cuda.device)

    @staticmethod
    def current_device() -> int:
        return -1


class CpuTorch:
    """The interop module's `torch` on a CPU-only torch: torch itself but for `cuda` (the only change above the
    native layer: on a GPU the facade's own calls run)."""
    cuda = _CpuCuda

    def __getattr__(self, name):
        return getattr(torch, name)
