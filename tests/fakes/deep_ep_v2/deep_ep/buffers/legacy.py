"""Stub of V2's legacy `deep_ep.Buffer` (v2 `deep_ep/buffers/legacy.py`): a V2 install exports the name; the fake
only keeps it (and `check_nvlink_connections` in this module, which moebench's shared-GPU bypass replaces)."""
from typing import Optional

import torch.distributed as dist

from ..utils.envs import check_nvlink_connections  # noqa: F401  (the name Buffer.__init__ calls)


class Buffer:
    num_sms: int = 20

    def __init__(self, group: Optional[dist.ProcessGroup], num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm=None) -> None:
        raise NotImplementedError("fake deep_ep V2: the legacy Buffer is a stub (use tests/fakes/deep_ep for it)")
