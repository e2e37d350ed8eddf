"""NCCL windows for NCCL EP's zero-copy path (`ncclep` with zero_copy, Megatron-Core 0.19's `moe_ncclep_zero_copy`).

NCCL EP skips its token staging when dispatch's output and combine's input are NCCL windows and the group says so
(GroupConfig.zero_copy ON; nccl-extensions docs/zero-copy.md): peers then read and write the caller's tensors. A
window is memory from NCCL's allocator (ncclMemAlloc: nccl.core.mem_alloc) registered collectively on the
communicator NCCL EP runs on (ncclCommWindowRegister, symmetric). Megatron gets the same from Transformer Engine's
symm_mem_alloc on its own communicator. Every rank must register, so the ranks agree first that each could allocate,
and afterwards that each got a handle (a platform without windows answers 0): otherwise no window is used and the
library stages, which `state()` says with why. On a CPU rank (tests: the fake native layer) the memory is the host's.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _agree(why: str, group) -> str:
    """The first rank's complaint ('' when none has one), on every rank of `group`."""
    if group is None or dist.get_world_size(group) == 1:
        return why
    whys = [None] * dist.get_world_size(group)
    dist.all_gather_object(whys, why, group=group)
    return next((w for w in whys if w), "")


def _alloc(nbytes: int, device: torch.device):
    """(memory from NCCL's allocator as a uint8 tensor, the buffer that owns it); host memory on a CPU rank."""
    if device.type != "cuda":
        return torch.empty(nbytes, dtype=torch.uint8), None
    import nccl.core as nc
    buf = nc.mem_alloc(nbytes, device.index if device.index is not None else torch.cuda.current_device())
    return torch.from_dlpack(buf).view(torch.uint8)[:nbytes], buf


class Windows:
    """The window-backed tensors of one backend, on NCCL EP's communicator `comm`; `ok` once every rank holds a
    window for each (then GroupConfig.zero_copy may be ON)."""

    def __init__(self, comm, group, device: torch.device, why: str = ""):
        self.comm, self.group, self.device = comm, group, device
        self.kept: dict[int, tuple] = {}          # data_ptr -> (tensor, buffer, window)
        self.why = why                            # why the library stages after all ('' while every window holds)

    def empty(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A tensor of `shape`, a window where every rank could make one, else plain memory (and `why` says why)."""
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        mem, buf, why = None, None, self.why
        if not why:
            try:
                mem, buf = _alloc(nbytes, self.device)
            except Exception as e:  # noqa: BLE001 - no NCCL allocator here: the library stages
                why = f"ncclMemAlloc failed: {type(e).__name__}: {e}"
        self.why = _agree(why, self.group)
        if self.why:
            return torch.empty(shape, dtype=dtype, device=self.device)
        import nccl.core as nc
        win = self.comm.register_window(mem, nc.WindowFlag.COLL_SYMMETRIC)
        self.why = _agree("" if win.handle else "ncclCommWindowRegister gave no window (unsupported here)", self.group)
        t = mem.view(dtype).view(shape)
        self.kept[t.data_ptr()] = (t, buf, win)
        return t

    @property
    def ok(self) -> bool:
        return bool(self.kept) and not self.why

    def tensor(self, t: torch.Tensor):
        """nccl.ep's descriptor of `t`: window-backed where t is one of the windows and they all hold."""
        import nccl.ep as ep
        kept = self.kept.get(t.data_ptr()) if self.ok else None
        return ep.Tensor(t, window=kept[2], window_offset=0) if kept is not None else ep.Tensor(t)

    def state(self) -> str:
        """What the record says of the library's zero copy."""
        if self.ok:
            return "ON: dispatch output and combine input are NCCL windows (the library's token staging elided)"
        return f"off, the library stages: {self.why or 'no window made'}"

    def destroy(self) -> None:
        """Deregister every window (local), then free NCCL's memory."""
        for _, buf, win in self.kept.values():
            win.close()
            if buf is not None:
                buf.close()
        self.kept.clear()
