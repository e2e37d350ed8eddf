"""A fake deep_ep for the container-gate tests: importing it works, constructing a buffer does what
FAKE_DEEP_EP_CTOR says (segv | abort | hang | raise), as broken real builds do; FAKE_DEEP_EP_CTOR=sim
gives working CPU stand-ins instead (sim.py: Buffer, hybrid_sim.py: HybridEPBuffer)."""
import ctypes
import os
import time

import torch

topk_idx_t = torch.int64


def _construct():
    how = os.environ.get("FAKE_DEEP_EP_CTOR", "segv")
    if how == "segv":
        ctypes.string_at(0)
    elif how == "abort":
        os.abort()
    elif how == "hang":
        time.sleep(3600)
    raise RuntimeError("fake deep_ep: CUDA is not available")


class _Config:
    def get_nvl_buffer_size_hint(self, hidden_bytes, ranks):
        return 1 << 20

    def get_rdma_buffer_size_hint(self, hidden_bytes, ranks):
        if os.environ.get("FAKE_DEEP_EP_NO_NVSHMEM"):    # what a real build without NVSHMEM does
            raise RuntimeError("Failed: Assertion error csrc/config.hpp:101 'false and \"NVSHMEM is disable during compilation\"'")
        return 0


class Buffer:
    num_sms = 20

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, explicitly_destroy=False):
        _construct()

    @classmethod
    def set_num_sms(cls, n):
        cls.num_sms = n

    @staticmethod
    def get_dispatch_config(ranks):
        return _Config()

    @staticmethod
    def get_combine_config(ranks):
        return _Config()


class HybridEPBuffer:
    def __init__(self, group, hidden_dim, max_num_of_tokens_per_rank, num_local_experts, **kwargs):
        _construct()


if os.environ.get("FAKE_DEEP_EP_CTOR") == "sim":
    from .hybrid_sim import HybridEPBuffer  # noqa: E402,F401,F811
    from .sim import Buffer, Config  # noqa: E402,F401,F811
