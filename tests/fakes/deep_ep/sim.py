"""A working stand-in for DeepEP's legacy Buffer on CPU ranks (gloo), selected with FAKE_DEEP_EP_CTOR=sim.

It follows the hybrid-ep branch's Python API (deep_ep/buffer.py) and the semantics moebench relies on:
received tokens ordered by source rank then token, recv_topk_idx local (-1 elsewhere) with weight 0
there, an unweighted combine, a cached dispatch that refuses topk_idx, the low-latency layout
(layout_range = begin << 32 | count; slots past the counts hold NaN, as torch.empty would hold
garbage) and DeepEP main's low-latency assertions (NVSHMEM QP depth >= 2 (T + 1), ranks x T % 4).
Every rank exchanges whole tensors with all_gather_object: slow, and only for small test shapes.
`calls` lists the API calls made, so tests can tell what a timed callable runs.
"""
import os

import torch
import torch.distributed as dist
from gloo_bytes import gather as _gather

CONFIG_RANKS = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)


class EventOverlap:
    def current_stream_wait(self):
        pass


class Config:
    def __init__(self, num_sms=20, nvl_send=6, nvl_recv=256, rdma_send=6, rdma_recv=256):
        self.num_sms = num_sms

    def get_nvl_buffer_size_hint(self, hidden_bytes, ranks):
        return 1 << 20

    def get_rdma_buffer_size_hint(self, hidden_bytes, ranks):
        return 0 if ranks <= 8 else 1 << 20


def _split(x):
    return x if isinstance(x, tuple) else (x, None)


class Buffer:
    num_sms = 20

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, explicitly_destroy=False):
        check_nvlink_connections(group)
        self.group, self.rank, self.world = group, dist.get_rank(group), dist.get_world_size(group)
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes     # Megatron's get_buffer reads them
        self.low_latency_mode, self.explicitly_destroy, self.calls = low_latency_mode, explicitly_destroy, []
        if low_latency_mode:         # what Buffer.__init__ does on every branch; main also keeps the value
            os.environ["NVSHMEM_QP_DEPTH"] = os.environ.get("NVSHMEM_QP_DEPTH", "1024")
            self.nvshmem_qp_depth = int(os.environ["NVSHMEM_QP_DEPTH"])

    def destroy(self):
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        self.calls.append("destroy")

    @classmethod
    def set_num_sms(cls, n):
        assert n % 2 == 0, "The SM count must be even"
        cls.num_sms = n

    @classmethod
    def get_dispatch_config(cls, num_ranks):
        assert num_ranks in CONFIG_RANKS, f"Unsupported number of EP ranks: {num_ranks}"
        return Config(cls.num_sms)

    get_combine_config = get_dispatch_config

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        return 1 << 20

    # ------------------------------------------------------------------ normal mode
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        self.calls.append("get_dispatch_layout")
        T, L = topk_idx.shape[0], num_experts // self.world
        valid = topk_idx >= 0
        in_rank = torch.zeros(T, self.world + 1, dtype=torch.bool)
        in_rank[torch.arange(T)[:, None], torch.where(valid, topk_idx // L, self.world)] = True
        in_rank = in_rank[:, :self.world].contiguous()
        per_expert = torch.bincount(topk_idx[valid], minlength=num_experts).int()
        return in_rank.sum(0).int(), None, per_expert, in_rank, EventOverlap()

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None, is_token_in_rank=None,
                 num_tokens_per_expert=None, topk_idx=None, topk_weights=None, expert_alignment=1, num_worst_tokens=0,
                 config=None, previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        self.calls.append("dispatch(handle)" if handle is not None else "dispatch")
        x, scales = _split(x)
        if handle is not None:
            assert topk_idx is None and topk_weights is None
            in_rank = handle[4]
        else:
            assert num_tokens_per_rank is not None and is_token_in_rank is not None and num_tokens_per_expert is not None
            in_rank = is_token_in_rank
        me, L = self.rank, (num_tokens_per_expert.numel() // self.world if handle is None else 0)
        xs, ss, ids, ws, masks, src = [], [], [], [], [], []
        sent = _gather(self.group, (x, scales, topk_idx, topk_weights, in_rank))
        for xs_, ss_, idx_, w_, in_ in sent:
            m = in_[:, me]
            xs.append(xs_[m])
            ss.append(ss_[m] if ss_ is not None else None)
            src.append(torch.nonzero(m).flatten().int())
            masks.append(m)
            if idx_ is not None:
                local = torch.where((idx_ >= me * L) & (idx_ < (me + 1) * L), idx_ - me * L, -1)[m]
                ids.append(local)
                ws.append(torch.where(local >= 0, w_[m], 0.0))
        recv_x = torch.cat(xs)
        if scales is not None:
            recv_x = (recv_x, torch.cat(ss))
        if handle is not None:
            return recv_x, None, None, None, None, EventOverlap()
        counts = torch.stack([m_.sum() for m_ in masks])
        prefix = torch.cumsum(torch.stack([g[4].sum(0) for g in sent]), 0)     # [i][j]: j's rows from ranks <= i
        recv_idx = torch.cat(ids) if ids else None
        recv_w = torch.cat(ws) if ws else None
        per_expert = [int((recv_idx == e).sum()) for e in range(L)] if recv_idx is not None else []
        handle = (prefix.int(), None, counts, torch.cat(src), in_rank, None)
        return recv_x, recv_idx, recv_w, per_expert, handle, EventOverlap()

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None, async_finish=False,
                allocate_on_comm_stream=False):
        self.calls.append("combine")
        prefix, _, _, src_idx, in_rank, _ = handle
        me, T = self.rank, in_rank.shape[0]
        out = torch.zeros(T, x.shape[1], dtype=torch.float32)
        for d, (x_d, prefix_d, src_d) in enumerate(_gather(self.group, (x, prefix, src_idx))):
            lo = int(prefix_d[me - 1, d]) if me else 0       # rows rank d received from this rank
            hi = int(prefix_d[me, d])
            out.index_add_(0, src_d[lo:hi].long(), x_d[lo:hi].float())
        return out.to(x.dtype), None, EventOverlap()

    # ------------------------------------------------------------------ low-latency mode
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, topk_weights=None,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             x_global_scale=None, use_fp8=True, round_scale=False, use_ue8m0=False, use_nvfp4=False,
                             use_ue8m0_for_sf=False, async_finish=False, return_recv_hook=False):
        self.calls.append("low_latency_dispatch")
        M = num_max_dispatch_tokens_per_rank
        assert self.low_latency_mode and not use_fp8 and not use_nvfp4, "the fake carries bf16 only"
        assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.shape[0] <= M
        assert topk_idx.dtype == torch.int64
        assert self.nvshmem_qp_depth >= (M + 1) * 2                       # DeepEP main's assertion
        assert (self.world * M) % 4 == 0, "TMA requires the number of tokens to be multiple of 4"
        L, me, H = num_experts // self.world, self.rank, x.shape[1]
        recv = torch.full((L, self.world * M, H), float("nan"), dtype=torch.bfloat16)
        src_info = torch.full((L, self.world * M), -1, dtype=torch.int32)
        layout = torch.zeros(L, self.world, dtype=torch.int64)
        count = torch.zeros(L, dtype=torch.int32)
        for s, (x_s, idx_s) in enumerate(_gather(self.group, (x, topk_idx))):
            for l in range(L):
                toks = torch.nonzero((idx_s == me * L + l).any(1)).flatten()
                begin, n = int(count[l]), toks.numel()
                recv[l, begin:begin + n] = x_s[toks]
                src_info[l, begin:begin + n] = toks.int()
                layout[l, s] = (begin << 32) | n
                count[l] += n
        handle = (src_info, layout, M, H, num_experts)
        return recv, count, handle, EventOverlap(), None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False, zero_copy=False,
                            async_finish=False, return_recv_hook=False, out=None, combine_wait_recv_cost_stats=None):
        self.calls.append("low_latency_combine")
        src_info, layout, M, H, E = handle
        L, me = E // self.world, self.rank
        assert x.dim() == 3 and x.is_contiguous() and x.dtype == torch.bfloat16
        assert x.shape[0] == L and x.shape[1] == self.world * M
        # each rank sends back only its received slots: the rows of (local expert, source rank) ranges
        sent = {}
        for l in range(L):
            for s in range(self.world):
                begin, n = int(layout[l, s]) >> 32, int(layout[l, s]) & 0xFFFFFFFF
                sent[(l, s)] = (src_info[l, begin:begin + n].long(), x[l, begin:begin + n])
        res = torch.zeros(topk_idx.shape[0], H, dtype=torch.float32)
        for d, sent_d in enumerate(_gather(self.group, sent)):
            for l in range(L):
                toks, rows = sent_d[(l, me)]
                w = (topk_weights[toks] * (topk_idx[toks] == d * L + l)).sum(1, keepdim=True)
                res.index_add_(0, toks, rows.float() * w)
        return res.to(torch.bfloat16), EventOverlap(), None


def check_nvlink_connections(group, *args, **kwargs):
    """The NVML check, as deep_ep.buffer imports it by name (moebench's shared-GPU bypass replaces it)."""
