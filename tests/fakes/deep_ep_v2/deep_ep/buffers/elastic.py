"""Fake DeepEP V2 `ElasticBuffer` / `EPHandle` (v2 `deep_ep/buffers/elastic.py`, epv2-release 018f21e) over gloo.

Public signatures and Python-side asserts are the real ones (`elastic.py:56-87, 123-264, 323-331, 663-883`); the
C++ runtime's EP_HOST_ASSERTs (`csrc/elastic/buffer.hpp`) raise RuntimeError("Assertion exception (...)").
Semantics (as `deep_ep/utils/refs.py:10-128` and `tests/elastic/test_ep.py`): dispatch sends each token once to each
rank holding one of its experts, rows ordered by source rank then token; recv_topk_idx holds local ids or -1 and
recv_topk_weights 0 there. do_expand: one row per (token, local expert), grouped by local expert, each expert's
zone padded to expert_alignment with zero rows, recv_topk_idx None and 1-D weights (`buffer.hpp:1012-1047`).
CPU sync (default unless a handle is given) gives exact row counts; without it the worst case is allocated
(`buffer.hpp:1003-1008`) and the rows past the real count hold NaN (torch.empty's garbage). A cached dispatch
(`handle=`) returns the handle dispatch's rows. combine (bf16 only, `buffer.hpp:1134`) is a plain sum of the rows
each token contributed, reduced within a rank first when allow_multiple_reduction (bf16 rounding there, as
refs.combine), fp32 accumulate; combined_topk_weights carries each owner rank's received weights back (None in
expand mode or without weights). `calls` lists the API calls the buffer received.
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import _sim
from ..utils.envs import (check_fast_rdma_atomic_support, check_nvlink_connections, check_torch_deterministic,
                          get_logical_domain_size, get_physical_domain_size)
from ..utils.event import EventHandle, EventOverlap

_storage = {}


def get_nccl_comm_handle(group):
    """v2 `utils/comm.py:41-71`: the first call per group gathers a unique id over it (collective), then cached."""
    if group not in _storage:
        ids = [None] * group.size()
        dist.all_gather_object(ids, b"fake-nccl-unique-id", group)
        _storage[group] = id(group)
    return _storage[group]


def _align(n, a):
    return -(-n // a) * a


def _value_or(v, d):
    return d if v is None else v


class EPHandle:
    """v2 `elastic.py:24-87`: the same constructor and attributes (`num_recv_tokens` = recv_src_metadata rows)."""

    def __init__(self, do_expand: bool, num_experts: int, expert_alignment: int, num_max_tokens_per_rank: int,
                 num_sms: int, topk_idx: torch.Tensor, num_recv_tokens_per_expert_list: list,
                 psum_num_recv_tokens_per_scaleup_rank: torch.Tensor, psum_num_recv_tokens_per_expert: torch.Tensor,
                 recv_src_metadata: torch.Tensor, dst_buffer_slot_idx: torch.Tensor,
                 token_metadata_at_forward: Optional[torch.Tensor], channel_linked_list: Optional[torch.Tensor]):
        assert topk_idx is not None
        self.do_expand, self.num_experts, self.expert_alignment = do_expand, num_experts, expert_alignment
        self.num_max_tokens_per_rank, self.num_sms, self.topk_idx = num_max_tokens_per_rank, num_sms, topk_idx
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self.recv_src_metadata, self.dst_buffer_slot_idx = recv_src_metadata, dst_buffer_slot_idx
        self.token_metadata_at_forward, self.channel_linked_list = token_metadata_at_forward, channel_linked_list
        self.num_recv_tokens = recv_src_metadata.shape[0]


class _Runtime:
    """Stands for `_C.ElasticBuffer`: gone (None) after destroy(), so later calls fail on it like the real one."""
    def destroy(self):
        pass


class ElasticBuffer:
    def __init__(self, group: dist.ProcessGroup, num_bytes: Optional[int] = None, num_max_tokens_per_rank: int = 0,
                 hidden: int = 0, num_topk: int = 0, use_fp8_dispatch: bool = False, deterministic: bool = False,
                 allow_hybrid_mode: bool = True, allow_multiple_reduction: bool = True,
                 prefer_overlap_with_compute: bool = True, sl_idx: int = 3, num_allocated_qps: int = 0,
                 num_cpu_timeout_secs: int = 300, num_gpu_timeout_secs: int = 100, explicitly_destroy: bool = False):
        """Collective (the comm handle's all_gather and the closing group.barrier(), `elastic.py:169, 224-227`)."""
        self.calls: List[str] = ["__init__"]
        self.group, self.rank_idx, self.num_ranks = group, group.rank(), group.size()
        self.allow_hybrid_mode, self.allow_multiple_reduction = allow_hybrid_mode, allow_multiple_reduction
        self.prefer_overlap_with_compute, self.deterministic = prefer_overlap_with_compute, deterministic
        self.nccl_comm_handle = get_nccl_comm_handle(group)
        if num_bytes is None:
            num_bytes = self._size(self.num_ranks, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch)
        self.num_bytes, self.num_max_tokens_per_rank = num_bytes, num_max_tokens_per_rank
        check_nvlink_connections(group)
        if num_allocated_qps == 0:
            num_allocated_qps = (65 if check_fast_rdma_atomic_support() else 129) if allow_hybrid_mode else 17
        self.num_allocated_qps, self.explicitly_destroy, self.runtime = num_allocated_qps, explicitly_destroy, _Runtime()
        self.num_scaleout_ranks, self.num_scaleup_ranks = self.get_logical_domain_size()
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        self.num_rdma_ranks, self.num_nvlink_ranks = self.get_physical_domain_size()
        group.barrier()

    @staticmethod
    def _size(num_ranks, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch):
        row = hidden * (1 if use_fp8_dispatch else 2) + _align(hidden, 128) // 128 * 4 + num_topk * 12 + 64
        return _align(2 * num_ranks * max(num_max_tokens_per_rank, 1) * row, 1 << 20)

    def destroy(self) -> None:
        assert self.explicitly_destroy
        self.calls.append("destroy")
        if self.runtime is not None:
            self.runtime.destroy()
            self.runtime, self.nccl_comm_handle = None, None

    @staticmethod
    def get_buffer_size_hint(group: dist.ProcessGroup, num_max_tokens_per_rank: int, hidden: int, num_topk: int = 0,
                             use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
                             allow_multiple_reduction: bool = True) -> int:
        get_nccl_comm_handle(group)
        return ElasticBuffer._size(group.size(), num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch)

    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False) -> None:
        self.calls.append("barrier")
        self._rt("barrier")
        dist.barrier(group=self.group)

    def _rt(self, name):
        """A destroyed buffer's runtime is None: the real call fails on it with this AttributeError."""
        if self.runtime is None:
            raise AttributeError(f"'NoneType' object has no attribute '{name}'")

    def get_physical_domain_size(self) -> Tuple[int, int]:
        return get_physical_domain_size(self.group)

    def get_logical_domain_size(self) -> Tuple[int, int]:
        return get_logical_domain_size(self.group, self.allow_hybrid_mode)

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, *args, **kwargs) -> int:
        """No NVLink speed on CPU: the real formula then gives 4 with prefer_overlap_with_compute, else >= 64. Like
        the real one (elastic.py get_expected_topk: `num_experts % num_groups`) it needs num_experts: a cached
        dispatch with num_sms=0 (num_experts None) raises TypeError there."""
        _ = num_experts % self.num_ranks
        return 4 if self.prefer_overlap_with_compute else 64

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        num_qps = num_sms * 16 + 1 if self.allow_hybrid_mode else min(num_sms, 8 + 1)
        return min(num_qps, self.num_allocated_qps)

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, x: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
                 topk_idx: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None,
                 cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None, num_experts: Optional[int] = None,
                 num_max_tokens_per_rank: Optional[int] = None, expert_alignment: Optional[int] = None,
                 num_sms: int = 0, num_qps: int = 0, previous_event=None, previous_event_before_epilogue=None,
                 async_with_compute_stream: bool = False, allocate_on_comm_stream: bool = False,
                 handle: Optional[EPHandle] = None, do_handle_copy: bool = True, do_cpu_sync: Optional[bool] = None,
                 do_expand: bool = False, use_tma_aligned_col_major_sf: bool = False):
        check_torch_deterministic()
        num_topk = (handle.topk_idx if topk_idx is None else topk_idx).shape[1]
        num_sms = self.get_theoretical_num_sms(num_experts, num_topk) if num_sms == 0 else num_sms
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        assert num_qps <= self.num_allocated_qps, 'Allocated QPs are not enough'
        x, sf = x if isinstance(x, tuple) else (x, None)
        cached = handle is not None
        if cached:
            assert topk_idx is None and topk_weights is None
            assert do_cpu_sync is None or not do_cpu_sync, 'Cannot do CPU sync with cached handle'
            topk_idx = handle.topk_idx
            num_max_tokens_per_rank = _value_or(num_max_tokens_per_rank, handle.num_max_tokens_per_rank)
            num_experts = _value_or(num_experts, handle.num_experts)
            expert_alignment = _value_or(expert_alignment, handle.expert_alignment)
            do_cpu_sync = False
            assert (num_experts, expert_alignment, num_max_tokens_per_rank) == \
                   (handle.num_experts, handle.expert_alignment, handle.num_max_tokens_per_rank)
        M = _value_or(num_max_tokens_per_rank, self.num_max_tokens_per_rank)
        align, do_cpu_sync = _value_or(expert_alignment, 1), _value_or(do_cpu_sync, True)
        self.calls.append("dispatch(handle)" if cached else "dispatch(expand)" if do_expand else "dispatch")
        if num_experts is None:
            raise TypeError("dispatch(): incompatible function arguments (num_experts: None)")
        self._rt("dispatch")
        R, T = self.num_ranks, x.shape[0]
        a = lambda ok, line, cond: _sim.ep_assert(ok, "elastic/buffer.hpp", line, cond)   # noqa: E731
        a(x.is_contiguous(), 682, "x.is_cuda() and x.is_contiguous()")
        a(x.shape[1] * x.element_size() % 16 == 0, 683, "(x.size(1) * x.element_size()) % sizeof(int4) == 0")
        a(T <= M, 684, "num_tokens <= num_max_tokens_per_rank")
        if sf is not None:
            a(sf.shape[0] == T, 693, "num_tokens == num_tokens_")
            a(sf.element_size() == 4, 695, "sf->element_size() == sizeof(sf_pack_t)")
        a(topk_idx.shape[0] == T, 704, "num_tokens == num_tokens_")
        a(topk_idx.dtype == torch.int64, 705, "topk_idx.scalar_type() == c10::CppTypeToScalarType<topk_idx_t>::value")
        a(topk_idx.is_contiguous(), 706, "topk_idx.is_cuda() and topk_idx.is_contiguous()")
        if topk_weights is not None:
            a(topk_weights.shape[0] == T, 712, "num_tokens == num_tokens__")
        a(num_experts % R == 0, 733, "num_experts % nccl_context->num_ranks == 0")
        a(not (cached and do_expand), 950, 'not do_expand and "Cannot do expand with cached mode"')
        _sim.jit_compile("dispatch_impl")
        L, me, K = num_experts // R, self.rank_idx, topk_idx.shape[1]
        sent = _sim.gather(self.group, (x, sf, topk_idx, topk_weights))
        xs, ss, ids, ws, src, per_rank = [], [], [], [], [], []
        for s, (x_s, sf_s, idx_s, w_s) in enumerate(sent):
            local = torch.where((idx_s >= me * L) & (idx_s < (me + 1) * L), idx_s - me * L, -1)
            toks = (local >= 0).any(1).nonzero().flatten()
            xs.append(x_s[toks]), ss.append(sf_s[toks] if sf_s is not None else None), ids.append(local[toks])
            ws.append(torch.where(local[toks] >= 0, w_s[toks], 0.0) if w_s is not None else None)
            src.append(s * M + toks), per_rank.append(len(toks))
        recv_idx, N = torch.cat(ids), sum(per_rank)
        recv_w = torch.cat(ws) if topk_weights is not None else None
        counts = [int((recv_idx == l).sum()) for l in range(L)]
        aligned = [_align(c, align) for c in counts]
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats += torch.tensor(counts, dtype=cumulative_local_expert_recv_stats.dtype)
        meta = torch.full((N, K + 2), -1, dtype=torch.int32)
        meta[:, 0], meta[:, 1] = torch.cat(src).int(), torch.arange(N, dtype=torch.int32)
        if do_expand:      # rows of (received token n, its k-th expert), by local expert then source rank then token
            n_k = [(n, k) for l in range(L) for n, k in (recv_idx == l).nonzero().tolist()]
            starts = [sum(aligned[:l]) for l in range(L)]
            rows_n = torch.tensor([n for n, _ in n_k], dtype=torch.long)
            dst = torch.tensor([starts[l] + i for l in range(L) for i in range(counts[l])], dtype=torch.long)
            if n_k:
                meta[rows_n, 2 + torch.tensor([k for _, k in n_k])] = dst.int()
            used, n_rows = sum(aligned), (sum(aligned) if do_cpu_sync else
                                          _align(R * M * min(K, L) + (align - 1) * L, align))
            psum_e = torch.tensor([(sum(aligned[:l]) + counts[l]) for l in range(L)], dtype=torch.int32)
        else:
            rows_n, dst = torch.arange(N), torch.arange(N)
            used, n_rows = N, (handle.num_recv_tokens if cached else N if do_cpu_sync else R * M)
            psum_e = torch.tensor(aligned, dtype=torch.int32).cumsum(0).int()
        recv_x = self._rows(torch.cat(xs), rows_n, dst, used, n_rows)
        recv_sf = self._rows(torch.cat(ss), rows_n, dst, used, n_rows) if sf is not None else None
        if recv_sf is not None and use_tma_aligned_col_major_sf:
            recv_sf = torch.empty_strided(recv_sf.shape, (1, _align(n_rows, 4)), dtype=recv_sf.dtype).copy_(recv_sf)
        if do_expand:
            out_idx = None
            out_w = self._rows(recv_w[rows_n, [k for _, k in n_k]] if n_k else recv_w[:0, 0], torch.arange(len(n_k)),
                               dst, used, n_rows) if recv_w is not None else None
        else:
            out_idx = self._rows(recv_idx, rows_n, dst, N, n_rows)
            out_w = self._rows(recv_w, rows_n, dst, N, n_rows) if recv_w is not None and not cached else None
        if not cached:
            meta = self._rows(meta, torch.arange(N), torch.arange(N), N, R * M if not do_cpu_sync else N)
            handle = EPHandle(do_expand, num_experts, align, M, num_sms,
                              topk_idx.clone() if do_handle_copy else topk_idx, aligned if do_cpu_sync else [],
                              torch.tensor(per_rank, dtype=torch.int32).cumsum(0).int(), psum_e, meta,
                              torch.zeros(0, dtype=torch.int32), None, None)
        return (recv_x, recv_sf) if recv_sf is not None else recv_x, out_idx, out_w, handle, \
            EventOverlap(EventHandle())

    @staticmethod
    def _rows(src, take, dst, used, n_rows):
        """[n_rows, ...]: src[take] at rows dst, zero in the rest of [0, used), garbage (NaN / -1) past it."""
        out = torch.empty((n_rows, *src.shape[1:]), dtype=src.dtype)
        _sim.garbage(out)
        _sim.u8(out[:used]).zero_() if out.dim() > 1 else out[:used].zero_()
        if len(dst):
            if out.dim() > 1:
                _sim.u8(out)[dst] = _sim.u8(src)[take]
            else:
                out[dst] = src[take]
        return out

    # ------------------------------------------------------------------ combine
    def combine(self, x: torch.Tensor, handle: EPHandle, topk_weights: Optional[torch.Tensor] = None,
                bias: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]] = None, num_sms: int = 0,
                num_qps: int = 0, previous_event=None, previous_event_before_epilogue=None,
                async_with_compute_stream: bool = False, allocate_on_comm_stream: bool = False):
        check_torch_deterministic()
        num_sms = handle.num_sms if num_sms == 0 else num_sms
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        assert num_qps <= self.num_allocated_qps, 'Allocated QPs are not enough'
        bias_0, bias_1 = (bias if isinstance(bias, tuple) else (bias, None))
        self.calls.append("combine")
        self._rt("combine")
        a = lambda ok, line, cond: _sim.ep_assert(ok, "elastic/buffer.hpp", line, cond)   # noqa: E731
        a(num_sms > 0, 1129, "num_sms > 0")
        a(x.is_contiguous(), 1133, "x.is_cuda() and x.is_contiguous()")
        a(x.dtype == torch.bfloat16, 1134, "x.scalar_type() == torch::kBFloat16")
        a(x.shape[1] * x.element_size() % 16 == 0, 1135, "(x.size(1) * x.element_size()) % sizeof(int4) == 0")
        T, M, R, me = handle.topk_idx.shape[0], handle.num_max_tokens_per_rank, self.num_ranks, self.rank_idx
        a(T <= M, 1145, "num_combined_tokens <= num_max_tokens_per_rank")
        _sim.jit_compile("combine_impl")
        N = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
        meta = handle.recv_src_metadata[:N].long()
        if handle.do_expand:            # the rows of each received token: its experts' expanded rows
            n_of, rows = (meta[:, 2:] >= 0).nonzero(as_tuple=True)[0], meta[:, 2:][meta[:, 2:] >= 0]
        else:
            n_of, rows = torch.arange(N), torch.arange(N)
        _sim.fake_check(x.shape[0] > int(rows.max()) if len(rows) else True, "combine x has fewer rows than the handle")
        acc = torch.zeros(N, x.shape[1], dtype=torch.float32).index_add_(0, n_of, x[rows].float())
        part = acc.to(torch.bfloat16) if self.allow_multiple_reduction else acc   # reduced within the rank first
        w = topk_weights[:N] if topk_weights is not None and not handle.do_expand else None
        send = {s: (meta[:, 0][meta[:, 0] // M == s] % M, part[meta[:, 0] // M == s],
                    w[meta[:, 0] // M == s] if w is not None else None) for s in range(R)}
        out = torch.zeros(T, x.shape[1], dtype=torch.float32)
        out_w = torch.zeros(T, handle.topk_idx.shape[1], dtype=torch.float32) if w is not None else None
        L = handle.num_experts // R
        for d, sent_d in enumerate(_sim.gather(self.group, send)):
            toks, part_d, w_d = sent_d[me]
            out.index_add_(0, toks, part_d.float())
            if out_w is not None:
                owned = handle.topk_idx[toks] // L == d
                out_w[toks] += torch.where(owned & (handle.topk_idx[toks] >= 0), w_d, 0.0)
        for b in (bias_0, bias_1):
            if b is not None:
                out += b.float()
        return out.to(torch.bfloat16), out_w, EventOverlap(EventHandle())
