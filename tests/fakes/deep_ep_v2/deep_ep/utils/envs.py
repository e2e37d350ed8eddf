"""Stand-ins of v2 `deep_ep/utils/envs.py`: one node, every rank a scale-up (NVLink) peer."""
import torch
import torch.distributed as dist


def get_physical_domain_size(group: dist.ProcessGroup):
    """(num_rdma_ranks, num_nvlink_ranks)."""
    return 1, group.size()


def get_logical_domain_size(group: dist.ProcessGroup, allow_hybrid_mode: bool = True):
    """(num_scaleout_ranks, num_scaleup_ranks)."""
    return 1, group.size()


def check_nvlink_connections(group: dist.ProcessGroup) -> None:
    """The real one (`envs.py:145-180`) asks NVML only for GPU names containing "PCIE"; CPU ranks have none."""


def check_torch_deterministic() -> None:
    """`envs.py:183-190`."""
    assert not (torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory)


def check_fast_rdma_atomic_support(nic_name: str = "") -> bool:
    return True
