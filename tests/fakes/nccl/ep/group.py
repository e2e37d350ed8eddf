"""Fake `nccl.ep.Group` / `GroupConfig` (whl `nccl/ep/group.py`), simulated over the communicator's gloo group.

`Group.create` is collective (whl `group.py:122-141`) and makes the checks of `ncclEpCreateGroup` (ext
`nccl_ep.cc:1648-2100`): HT max_token_bytes % 16 (`:1674-1682`, InvalidArgument), max_dispatch_tokens_per_rank > 0
(`:1683-1688`, assert), HT max_recv_tokens_per_rank >= max_dispatch_tokens_per_rank when set (`:1816-1819`),
num_topk <= num_experts (`:1820-1822`), eager mode without DROP (`:1831-1836`), the same recv budget on every rank
(`:1846-1856`), LL warp groups ceil(E / comm SMs) <= 14 when max_num_sms is given (`:1785-1800`, InvalidUsage; the
default, all SMs of the device, is not simulated). `num_experts % nranks == 0` is asserted where the real one does:
at handle init (`:2865`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from nccl.core import NcclInvalid
from nccl.ep import _sim
from nccl.ep.allocator import AllocConfig
from nccl.ep.enums import Algorithm, Layout, OverflowPolicy, ZeroCopyMode
from nccl.ep.handle import Handle, HandleConfig, LayoutInfo

__all__ = ["Group", "GroupConfig"]

LL_MAX_WARP_GROUPS = 14


@dataclass
class GroupConfig:
    """Fields and defaults of whl `group.py:31-110` (`ncclEpGroupConfig_t`, `include/nccl_ep.h:263-334`)."""
    algorithm: Algorithm = Algorithm.LOW_LATENCY
    num_experts: int = 0
    max_dispatch_tokens_per_rank: int = 0
    max_recv_tokens_per_rank: int = 0
    max_token_bytes: int = 0
    rdma_buffer_size: int = 0
    num_qp_per_rank: int = 0
    num_channels: int = 0
    max_num_sms: int = 0
    alloc: AllocConfig = field(default_factory=AllocConfig)
    enable_mask: bool = False
    timeout_ns: int = 0
    zero_copy: ZeroCopyMode = ZeroCopyMode.AUTO
    overflow_policy: OverflowPolicy = OverflowPolicy.AUTO
    num_topk: int = 0


class Group:
    """Construct with `create`; `calls` lists the API calls made on it ("create", "create_handle", "destroy")."""

    def __init__(self, ptr: int) -> None:
        self._ptr = ptr
        self.calls: list[str] = []

    @classmethod
    def create(cls, comm, config: GroupConfig) -> Group:
        c, group = config, comm.group
        ht = c.algorithm == Algorithm.HIGH_THROUGHPUT
        nranks, rank = dist.get_world_size(group), dist.get_rank(group)
        if ht and c.max_token_bytes % 16:
            _sim.invalid(_sim.INVALID_ARGUMENT,
                         f"NCCL EP: HT max_token_bytes ({c.max_token_bytes}) must be a multiple of 16 bytes")
        _sim.c_assert(not (not ht and c.max_dispatch_tokens_per_rank == 0), 1684,
                      '!(in_config->algorithm == NCCL_EP_ALGO_LOW_LATENCY && in_config->max_dispatch_tokens_per_rank '
                      '== 0) && "ncclEpCreateGroup: max_dispatch_tokens_per_rank must be greater than 0 for low '
                      'latency mode"', "ncclEpCreateGroup")
        _sim.c_assert(not (ht and c.max_dispatch_tokens_per_rank == 0), 1687,
                      '!(in_config->algorithm == NCCL_EP_ALGO_HIGH_THROUGHPUT && in_config->max_dispatch_tokens_per_'
                      'rank == 0) && "ncclEpCreateGroup: max_dispatch_tokens_per_rank must be set for HT backend"',
                      "ncclEpCreateGroup")
        if not ht and c.max_num_sms:
            groups = -(-c.num_experts // c.max_num_sms)
            if groups > LL_MAX_WARP_GROUPS:
                _sim.invalid(_sim.INVALID_USAGE,
                             f"Error: insufficient comm SM count for Low-Latency mode: {c.max_num_sms} SMs with "
                             f"{c.num_experts} experts gives {groups} warp groups (max {LL_MAX_WARP_GROUPS}). Need >= "
                             f"{-(-c.num_experts // LL_MAX_WARP_GROUPS)} SMs -- raise ncclEpGroupConfig_t::max_num_sms "
                             "or NCCL_EP_COMM_SMS.")
        _sim.host_assert(not (ht and c.max_recv_tokens_per_rank and
                              c.max_recv_tokens_per_rank < c.max_dispatch_tokens_per_rank), 1816,
                         '... && "ncclEpCreateGroup: HT mode requires max_recv_tokens_per_rank >= '
                         'max_dispatch_tokens_per_rank"')
        _sim.host_assert(not (c.num_topk and c.num_topk > c.num_experts), 1820,
                         '... && "ncclEpCreateGroup: num_topk must be <= num_experts"')
        eager = ht and c.max_recv_tokens_per_rank == 0
        if eager:
            _sim.host_assert(c.overflow_policy != OverflowPolicy.DROP, 1833,
                             'ep_group->config.overflow_policy != NCCL_EP_OVERFLOW_DROP && "ncclEpCreateGroup: eager '
                             'mode (max_recv_tokens_per_rank = NCCL_EP_AUTO) does not support NCCL_EP_OVERFLOW_DROP"')
            budget = nranks * c.max_dispatch_tokens_per_rank * (c.num_topk or 1)
        else:
            budget = c.max_recv_tokens_per_rank or nranks * c.max_dispatch_tokens_per_rank
        budgets = _sim.gather(group, budget)           # collective, as ncclAllGatherHost at :1850
        _sim.host_assert(all(b == budgets[0] for b in budgets), 1852,
                         'all_budgets[r] == all_budgets[0] && "ncclEpCreateGroup: max_recv_tokens_per_rank must be '
                         'identical across ranks"')
        g = cls(id(comm) + 1)
        g.comm, g.config, g.group, g.rank, g.nranks = comm, config, group, rank, nranks
        g.ht, g.eager, g.max_recv_tokens = ht, eager, budget
        g.calls.append("create")
        return g

    def _check_valid(self, operation: str) -> None:
        if not self._ptr:
            raise NcclInvalid(f"Cannot {operation}: Group is not initialized or has been destroyed")

    @property
    def ptr(self) -> int:
        self._check_valid("read ptr")
        return self._ptr

    @property
    def num_local_experts(self) -> int:
        return self.config.num_experts // self.nranks

    def create_handle(self, layout: Layout, topk_idx, *, layout_info: LayoutInfo | None = None,
                      config: HandleConfig | None = None, stream) -> Handle:
        """Collective (HT exchanges the routing here). Checks of `ncclEpInitHandle` (ext `nccl_ep.cc:2837-2890`)."""
        self._check_valid("create_handle")
        self.calls.append("create_handle")
        ll = not self.ht
        _sim.host_assert(layout != Layout.UNSET, 2860, "layout != NCCL_EP_LAYOUT_UNSET")
        _sim.host_assert(not (ll and layout not in (Layout.EXPERT_MAJOR, Layout.RANK_MAJOR)), 2860,
                         '... && "ncclEpInitHandle: LL mode supports only expert-major and rank-major layouts"')
        _sim.c_assert(self.config.num_experts > 0, 2864, "ep_group->config.num_experts > 0", "ncclEpInitHandle")
        _sim.c_assert(self.config.num_experts % self.nranks == 0, 2865,
                      "ep_group->config.num_experts % ep_group->nRanks == 0", "ncclEpInitHandle")
        align = config.dispatch_output_per_expert_alignment if (config and self.ht and
                                                                layout == Layout.EXPERT_MAJOR) else 0
        align = align if align > 1 else 1
        _sim.c_assert(align & (align - 1) == 0, 2873,
                      '(em_align & (em_align - 1)) == 0 && "dispatch_output_per_expert_alignment must be a power of '
                      'two"', "ncclEpInitHandle")
        if layout != Layout.EXPERT_MAJOR:
            raise NotImplementedError(f"fake nccl.ep simulates Layout.EXPERT_MAJOR only, not {Layout(layout).name}")
        h = Handle(self, Layout(layout), align, topk_idx.sizes[1])
        h._update(topk_idx, layout_info)
        return h

    def destroy(self) -> None:
        if self._ptr:
            self.calls.append("destroy")
            self._ptr = 0

    def __repr__(self) -> str:
        return f"<Group ptr={self._ptr:#x}>" if self._ptr else "<Group destroyed>"
