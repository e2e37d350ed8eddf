"""Test tiers: the default CPU tier runs anywhere; `gpu` / `multigpu` tests skip without GPUs."""
import os

import pytest
import torch

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")          # never use NVLink multicast on shared hosts
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def pytest_collection_modifyitems(config, items):
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and ngpu < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and ngpu < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, {ngpu} visible"))


class LaunchSpy:
    """Stands in for a Triton kernel launched as kernel[grid](...); counts launches
    (`from conftest import LaunchSpy`: pytest puts tests/ on sys.path)."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]
