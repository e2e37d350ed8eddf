"""ncclEpCreateHandle, ncclEpUpdateHandle, ncclEpHandleDestroy, ncclEpComplete (ext `nccl_ep.cc:2714-3215`, `:4923`)
for Layout.EXPERT_MAJOR.

create_handle is init (the handle's num_topk: topk_idx's second size) then update (`:3165-3188`). Init checks
(`:2855-2873`): the layout set and one the algorithm takes, num_experts % nranks, the alignment a power of two; HT
(`ht_init_handle`, `:2714-2736`): num_topk > 0, at most GroupConfig.num_topk when that is set, and required by eager
expert-major (InvalidUsage). Update (`:2893-2946`): topk_idx 2-D int32/int64, kept as a descriptor (the library reads
the data where it lies: LL at dispatch); LL takes no layout_info; HT: the handle's num_topk, at most
max_dispatch_tokens_per_rank tokens, then the routing exchange (collective, the ncclAllGather at `:3014`) and
LayoutInfo: expert_counters [L] (each local expert's rows, padded to HandleConfig.dispatch_output_per_expert_alignment),
expert_offsets [L] (their exclusive prefix), recv_total_counter [1] (their sum: the rows dispatch writes). A
routing whose rows exceed the group's budget traps in the scan (OverflowPolicy TRAP; DROP is not simulated).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from gloo_bytes import gather
from nccl._extensions.bindings import nccl_ep as bindings

from . import failures as f
from .group import Group, group_of
from .memory import Desc, desc, struct
from .registry import lookup, native, new_ptr, release

UNSET, EXPERT_MAJOR, RANK_MAJOR, FLAT = 0, 1, 2, 3
UPDATE = "ncclResult_t ncclEpUpdateHandle(...)"


@dataclass
class Handle:
    group: Group
    layout: int
    align: int
    num_topk: int
    idx: Desc | None = None
    em: dict | None = None      # HT: this rank's rows: pairs (local expert, source rank, tokens, k), first rows, total
    ll: dict | None = None      # LL: (local expert, source rank) -> (tokens, first slot, count), by the last dispatch

    @property
    def num_tokens(self) -> int:
        return self.idx.sizes[0]


def handle_of(ptr: int) -> Handle:
    return lookup(ptr, Handle, "ncclEpHandle_t")


@native
def create_handle(group_ptr, layout, topk_idx_ptr, layout_info_ptr, config_ptr, stream):
    g = group_of(group_ptr)
    idx = desc(topk_idx_ptr, required=True, func="ncclEpCreateHandle")
    info = struct(bindings.LayoutInfo, layout_info_ptr, "layout_info", optional=True)
    h = _init(g, layout, struct(bindings.HandleConfig, config_ptr, "config", optional=True),
              idx.sizes[1] if idx.ndim > 1 else 0)
    _update(h, idx, info)
    return new_ptr(h)


def _init(g: Group, layout: int, cfg, num_topk: int) -> Handle:
    f.host_assert(layout != UNSET, 2855, 'layout != NCCL_EP_LAYOUT_UNSET && "ncclEpInitHandle: layout must be set '
                  'explicitly"')
    f.host_assert(not g.ht or layout in (FLAT, EXPERT_MAJOR), 2859, '... && "ncclEpInitHandle: HT mode supports flat '
                  'and expert-major layouts"')
    f.host_assert(g.ht or layout in (EXPERT_MAJOR, RANK_MAJOR), 2863, '... && "ncclEpInitHandle: LL mode supports '
                  'only expert-major and rank-major layouts"')
    f.c_assert(g.config["num_experts"] % g.nranks == 0, 2865, "ep_group->config.num_experts % ep_group->nRanks == 0",
               "ncclEpInitHandle")
    align = cfg.dispatch_output_per_expert_alignment if cfg is not None and g.ht and layout == EXPERT_MAJOR else 1
    align = max(int(align), 1)
    f.c_assert(align & (align - 1) == 0, 2873, '(em_align & (em_align - 1)) == 0 && "dispatch_output_per_expert_'
               'alignment must be a power of two"', "ncclEpInitHandle")
    f.unsupported(layout == EXPERT_MAJOR, f"Layout.EXPERT_MAJOR is simulated, not layout {layout}")
    bound = g.config["num_topk"]
    if g.ht and num_topk <= 0:
        f.invalid(f.INVALID_USAGE, "HT mode requires num_topk > 0 (pass top_k to ncclEpInitHandle)")
    if g.ht and bound and num_topk > bound:
        f.invalid(f.INVALID_USAGE, "NCCL EP: num_topk exceeds ncclEpGroupConfig_t::num_topk")
    if g.eager and not bound:
        f.invalid(f.INVALID_USAGE, "NCCL EP: eager mode (max_recv_tokens_per_rank = NCCL_EP_AUTO) requires "
                  "ncclEpGroupConfig_t::num_topk for the Expert-Major layout")
    return Handle(g, layout, align, num_topk)


@native
def update_handle(handle_ptr, topk_idx_ptr, layout_info_ptr, stream):
    h = handle_of(handle_ptr)
    info = struct(bindings.LayoutInfo, layout_info_ptr, "layout_info", optional=True)
    _update(h, desc(topk_idx_ptr, required=True, func=UPDATE), info)


def _update(h: Handle, idx: Desc, info) -> None:
    g = h.group
    f.c_assert(idx.ndim == 2, 2908, "topk_idx->ndim == 2", UPDATE)
    f.c_assert(idx.dtype in (torch.int32, torch.int64), 2917, '(topk_idx->datatype == ncclInt32 || topk_idx->datatype '
               '== ncclInt64) && "topk_idx must be ncclInt32 or ncclInt64"', UPDATE)
    h.idx = idx
    if not g.ht:
        f.c_assert(idx.sizes[1] == h.num_topk, 2929, '... && "LL: num_topk mismatch between ncclEpInitHandle and '
                   'ncclEpUpdateHandle"', UPDATE)
        f.c_assert(info is None, 2930, 'layout_info == nullptr && "LL mode does not accept local tensors in '
                   'ncclEpUpdateHandle"', UPDATE)
        return
    f.c_assert(idx.sizes[1] == h.num_topk, 2941, '... && "Given topk_idx has unmatched num_topk that ncclEpHandle was '
               'created with!"', UPDATE)
    f.c_assert(h.num_tokens <= g.max_tokens, 2946, '... && "Token count exceeds HT buffer capacity"', UPDATE)
    L = g.local_experts
    pairs = _pairs(gather(g.comm.group, idx.tensor().to(torch.int64)), g.rank, L)
    counts = [sum(len(p[2]) for p in pairs if p[0] == e) for e in range(L)]
    padded = [-(-c // h.align) * h.align for c in counts]
    offsets = [sum(padded[:e]) for e in range(L)]
    begins, seen = [], [0] * L
    for e, _, toks, _ in pairs:
        begins.append(offsets[e] + seen[e])
        seen[e] += len(toks)
    f.device_assert(sum(padded) <= g.budget, "nccl_ep HT metadata scan",
                    f"{sum(padded)} recv rows <= max_recv_tokens_per_rank {g.budget} (OverflowPolicy TRAP)")
    h.em = dict(pairs=pairs, begins=begins, padded=padded, total=sum(padded))
    for name, vals in (("expert_counters", padded), ("expert_offsets", offsets), ("recv_total_counter", [sum(padded)])):
        d = desc(getattr(info, name), func=UPDATE) if info is not None else None
        if d is not None:
            f.unsupported(d.ndim == 1 and d.sizes[0] == len(vals), f"LayoutInfo.{name} must be [{len(vals)}]")
            d.tensor().copy_(torch.tensor(vals))


def _pairs(idxs, me: int, L: int) -> list:
    """(local expert, source rank, tokens, their k) of the (token, local expert) pairs rank `me` receives: by local
    expert, then source rank, then token."""
    out = []
    for e in range(L):
        for s, idx in enumerate(idxs):
            hit = idx == me * L + e
            toks = hit.any(1).nonzero().flatten()
            out.append((e, s, toks, hit[toks].int().argmax(1)))
    return out


@native
def complete(handle_ptr, config_ptr, stream):
    """LL send_only completion (`:4923`): the fake stages no transfer, so there is nothing to complete."""
    handle_of(handle_ptr)


@native
def handle_destroy(ptr):
    handle_of(ptr)
    release(ptr)
