"""Device memory as the driver sees it, beside torch's own counters.

DeepEP's and HybridEP's buffers (and NVSHMEM's symmetric heap, and CUDA contexts) are allocated
outside torch's caching allocator, so `torch.cuda.max_memory_reserved` misses them. Two driver-level
readings catch them: the memory this process holds on a GPU (NVML's per-process accounting: exact
even when several rank processes share one GPU), and the memory in use on the whole device
(cudaMemGetInfo: every process on it). Each is None where it cannot be read, never an error.
"""
from __future__ import annotations

import os


def process_bytes(device_index: int, pid: int | None = None) -> int | None:
    """Device memory process `pid` (default: this one) holds on GPU `device_index`, from NVML; None when
    NVML is missing or does not list the process (a container whose PIDs NVML does not see)."""
    pid = os.getpid() if pid is None else pid
    try:
        from .topology import nvml
        nv = nvml()
        h = nv.nvmlDeviceGetHandleByIndex(_nvml_index(device_index))
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    except Exception:  # noqa: BLE001 - NVML is optional
        return None
    used = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


def _nvml_index(device_index: int) -> int:
    """NVML counts every GPU; torch counts the visible ones (CUDA_VISIBLE_DEVICES as plain indices)."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.strip().isdigit() for v in visible) and device_index < len(visible):
        return int(visible[device_index])
    return device_index


def device_used_bytes(device_index: int) -> tuple[int, int] | None:
    """(bytes in use on the whole GPU, its total) from cudaMemGetInfo; None without CUDA."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(device_index)
    except Exception:  # noqa: BLE001
        return None
    return int(total - free), int(total)


def snapshot(device_index: int) -> dict:
    """Every reading at once: this process's bytes on the GPU (NVML), the device's bytes in use and total
    (cudaMemGetInfo), torch's allocated / reserved and their peaks."""
    out = {"process_bytes": process_bytes(device_index), "device_used_bytes": None, "device_total_bytes": None}
    dev = device_used_bytes(device_index)
    if dev:
        out["device_used_bytes"], out["device_total_bytes"] = dev
    try:
        import torch
        if torch.cuda.is_available():
            out.update(allocated_bytes=int(torch.cuda.memory_allocated(device_index)),
                       reserved_bytes=int(torch.cuda.memory_reserved(device_index)),
                       max_allocated_bytes=int(torch.cuda.max_memory_allocated(device_index)),
                       max_reserved_bytes=int(torch.cuda.max_memory_reserved(device_index)))
    except Exception:  # noqa: BLE001
        pass
    return out
