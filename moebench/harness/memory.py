"""What a backend holds in memory on each rank at this shape (the dispatcher choice weighs headroom too).

DeepEP's and HybridEP's buffers (NVSHMEM's symmetric heap among them) are allocated outside torch's
caching allocator, so torch's counters miss them. Per rank:
- buffers: the driver's reading after the backend's setup minus before it, less what torch reserved in
  between: the memory the backend holds outside torch. The driver reading is this process's bytes on
  the GPU (NVML), or where NVML cannot see the process the whole device's bytes in use
  (cudaMemGetInfo), which on a GPU shared by several ranks also counts the other ranks' setup;
- torch's peak allocated and reserved while the api view times the phases (the calls as a training step
  makes them: inputs, outputs, workspaces; the other views' graph pools and profiler are not the backend's);
- footprint = buffers + peak reserved.
On CPU there is no device memory: host RSS (this rank's setup delta and its peak) with the reason.
"""
from __future__ import annotations

import resource
import sys

import torch
import torch.distributed as dist

from ..env import gpumem


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_bytes() -> int:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kb if sys.platform == "darwin" else kb * 1024)


class Meter:
    """One rank's readings: `before()` ahead of the backend's setup, `after_setup()`, `timed()` ahead of the
    timed phases, `api_done()` after the api view, then `result()`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.index = device.index if device.index is not None else 0
        self.start = self.setup = None
        self.peaks = None

    def _read(self) -> dict:
        if not self.cuda:
            return {"rss": _rss_bytes()}
        torch.cuda.synchronize(self.device)
        return gpumem.snapshot(self.index)

    def before(self) -> None:
        self.start = self._read()

    def after_setup(self) -> None:
        self.setup = self._read()

    def timed(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def api_done(self) -> None:
        if self.cuda:
            self.peaks = (int(torch.cuda.max_memory_allocated(self.device)),
                          int(torch.cuda.max_memory_reserved(self.device)))

    def result(self, rank: int) -> dict:
        """This rank's figures (bytes); {rank, none: why} where a reading is missing."""
        if self.start is None or self.setup is None:
            return {"rank": rank, "none": "the backend was not set up"}
        if not self.cuda:
            a, b = self.start.get("rss"), self.setup.get("rss")
            return {"rank": rank, "none": "CPU run: no device memory; host RSS shown",
                    "host_setup_bytes": (b - a) if a is not None and b is not None else None,
                    "host_peak_bytes": _peak_rss_bytes()}
        source = "nvml" if self.start.get("process_bytes") is not None and \
            self.setup.get("process_bytes") is not None else "device"
        key = "process_bytes" if source == "nvml" else "device_used_bytes"
        if self.start.get(key) is None or self.setup.get(key) is None:
            return {"rank": rank, "none": "neither NVML nor cudaMemGetInfo could be read"}
        torch_setup = self.setup.get("reserved_bytes", 0) - self.start.get("reserved_bytes", 0)
        buffers = max(0, self.setup[key] - self.start[key] - torch_setup)
        if self.peaks is None:
            self.api_done()
        peak_alloc, peak_res = self.peaks
        return {"rank": rank, "buffers_bytes": buffers, "peak_allocated_bytes": peak_alloc,
                "peak_reserved_bytes": peak_res, "footprint_bytes": buffers + peak_res, "source": source}


def gather(mine: dict, group) -> list[dict]:
    """Every rank's figures, on every rank (over the run's gloo/NCCL group)."""
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [mine]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, mine, group=group)
    return out
