"""ncclEpCreateGroup / ncclEpGroupDestroy (ext `nccl_ep.cc:1648-2110`) over the communicator's gloo group.

create_group reads the caller's GroupConfig (wheel `nccl/ep/group.py:96-110`, ncclEpGroupConfig_t) and makes the
library's checks: num_experts and max_token_bytes > 0 (`:1668-1669`, assert), HT max_token_bytes % 16 (`:1674-1682`,
InvalidArgument), max_dispatch_tokens_per_rank > 0 (`:1683-1688`, assert), LL warp groups ceil(E / SMs) <= 14 when
max_num_sms is given (`:1785-1800`, InvalidUsage; the default, every SM of the device, is not simulated), HT
max_recv_tokens_per_rank >= max_dispatch_tokens_per_rank when set (`:1816-1819`), num_topk <= num_experts
(`:1820-1822`), eager mode without DROP (`:1831-1836`), the same resolved budget on every rank (`:1846-1856`,
collective). The budget it resolves (`:1831-1844`): HT eager (max_recv_tokens_per_rank 0) R x M x (num_topk or 1),
an internal bound only (the caller sizes outputs from recv_total_counter); HT fixed: the value given (outputs must
cover it); LL: R x M. `num_experts % nranks == 0` is asserted where the real one does: at handle init (`:2865`).
"""
from __future__ import annotations

from dataclasses import dataclass

from gloo_bytes import gather
from nccl._extensions.bindings import nccl_ep as bindings

from . import failures as f
from .libnccl import Comm, comm_of
from .memory import struct
from .registry import GROUP_CONFIGS, lookup, native, new_ptr, release

HIGH_THROUGHPUT, OVERFLOW_DROP, LL_MAX_WARP_GROUPS = 1, 2, 14
FIELDS = ("algorithm", "num_experts", "max_dispatch_tokens_per_rank", "max_recv_tokens_per_rank", "max_token_bytes",
          "rdma_buffer_size", "num_qp_per_rank", "num_channels", "max_num_sms", "enable_mask", "timeout_ns",
          "zero_copy", "overflow_policy", "num_topk")


@dataclass
class Group:
    comm: Comm
    config: dict                # the GroupConfig as read
    budget: int                 # the resolved max_recv_tokens_per_rank

    @property
    def ht(self) -> bool:
        return self.config["algorithm"] == HIGH_THROUGHPUT

    @property
    def eager(self) -> bool:
        return self.ht and self.config["max_recv_tokens_per_rank"] == 0

    @property
    def nranks(self) -> int:
        return self.comm.nranks

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def local_experts(self) -> int:
        return self.config["num_experts"] // self.nranks

    @property
    def max_tokens(self) -> int:
        return self.config["max_dispatch_tokens_per_rank"]


@native
def create_group(comm_ptr, config_ptr):
    comm = comm_of(comm_ptr)
    c = {k: int(getattr(struct(bindings.GroupConfig, config_ptr, "in_config"), k)) for k in FIELDS}
    ht, func = c["algorithm"] == HIGH_THROUGHPUT, "ncclEpCreateGroup"
    f.c_assert(c["num_experts"] > 0, 1668, 'in_config->num_experts > 0 && "ncclEpCreateGroup: num_experts must be '
               'greater than 0"', func)
    f.c_assert(c["max_token_bytes"] > 0, 1669, 'in_config->max_token_bytes > 0 && "ncclEpCreateGroup: '
               'max_token_bytes must be greater than 0"', func)
    if ht and c["max_token_bytes"] % 16:
        f.invalid(f.INVALID_ARGUMENT, f"NCCL EP: HT max_token_bytes ({c['max_token_bytes']}) must be a multiple of "
                  "16 bytes")
    M = c["max_dispatch_tokens_per_rank"]
    f.c_assert(ht or M > 0, 1684, '!(in_config->algorithm == NCCL_EP_ALGO_LOW_LATENCY && in_config->max_dispatch_'
               'tokens_per_rank == 0) && "ncclEpCreateGroup: max_dispatch_tokens_per_rank must be greater than 0 for '
               'low latency mode"', func)
    f.c_assert(not ht or M > 0, 1687, '!(in_config->algorithm == NCCL_EP_ALGO_HIGH_THROUGHPUT && in_config->max_'
               'dispatch_tokens_per_rank == 0) && "ncclEpCreateGroup: max_dispatch_tokens_per_rank must be set for HT '
               'backend"', func)
    sms = c["max_num_sms"]
    if not ht and sms and -(-c["num_experts"] // sms) > LL_MAX_WARP_GROUPS:
        f.invalid(f.INVALID_USAGE, f"Error: insufficient comm SM count for Low-Latency mode: {sms} SMs with "
                  f"{c['num_experts']} experts gives {-(-c['num_experts'] // sms)} warp groups (max "
                  f"{LL_MAX_WARP_GROUPS}). Need >= {-(-c['num_experts'] // LL_MAX_WARP_GROUPS)} SMs -- raise "
                  "ncclEpGroupConfig_t::max_num_sms or NCCL_EP_COMM_SMS.")
    recv, R = c["max_recv_tokens_per_rank"], comm.nranks
    f.host_assert(not (ht and recv and recv < M), 1816, '... && "ncclEpCreateGroup: HT mode requires '
                  'max_recv_tokens_per_rank >= max_dispatch_tokens_per_rank"')
    f.host_assert(not (c["num_topk"] and c["num_topk"] > c["num_experts"]), 1820,
                  '... && "ncclEpCreateGroup: num_topk must be <= num_experts"')
    if ht and not recv:
        f.host_assert(c["overflow_policy"] != OVERFLOW_DROP, 1833, 'ep_group->config.overflow_policy != NCCL_EP_'
                      'OVERFLOW_DROP && "ncclEpCreateGroup: eager mode (max_recv_tokens_per_rank = NCCL_EP_AUTO) '
                      'does not support NCCL_EP_OVERFLOW_DROP"')
        budget = R * M * (c["num_topk"] or 1)
    else:
        budget = recv or R * M
    budgets = gather(comm.group, budget)           # collective, as ncclAllGatherHost at :1850
    f.host_assert(all(b == budgets[0] for b in budgets), 1852, 'all_budgets[r] == all_budgets[0] && '
                  '"ncclEpCreateGroup: max_recv_tokens_per_rank must be identical across ranks"')
    GROUP_CONFIGS.append(c)
    return new_ptr(Group(comm, c, budget))


def group_of(ptr: int) -> Group:
    return lookup(ptr, Group, "ncclEpGroup_t")


@native
def group_destroy(ptr):
    group_of(ptr)
    release(ptr)
