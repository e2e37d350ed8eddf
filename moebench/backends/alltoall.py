"""`alltoall`: Megatron-Core's MoEAlltoAllTokenDispatcher path on plain torch.distributed.

dispatch: permute rows (and their routing weights, one launch) by global expert (= by destination
rank) -> exchange per-expert counts ->
one host sync for the splits -> all_to_all_single of the rows, then of the probs -> sort the
received (source rank, local expert) chunks into (local expert, source rank) order.
combine mirrors it: inverse chunk sort -> all_to_all_single back -> unpermute, an unweighted sum (the experts applied
the permuted probs dispatch handed them, as Megatron's `combine_postprocess` calls `unpermute` without probs).
It sends one copy per (token, expert), so its wire bytes exceed the deduplicated pairs.

No work that does nothing: with one rank or one local expert the chunk order is already expert-major,
so neither chunk sort runs (Megatron sorts anyway; `mcore-alltoall` keeps that). With several ranks
the permute writes into its upper-bound buffer without waiting for the row count; the send and receive
counts reach the host together in one copy, and the chunk sorts take their split sizes from the device
copy. With one rank the host learns the counts from the permute's index kernels, before its copy ends.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import ops
from .base import OPS_IMPL, Backend, Dispatched, exchange_sms


@dataclass
class _Handle:
    row_map_TK: torch.Tensor
    input_splits: list[int]      # rows sent to each rank
    output_splits: list[int]     # rows received from each rank
    recv_counts_WL: torch.Tensor  # rows received per (source rank, local expert), on the device


class AlltoallBackend(Backend):
    name = "alltoall"
    dedup = False
    supports_fp8 = True
    comm_kernels = ("nccl",)      # NCCL's send/recv kernels; none at EP 1 or on gloo
    KNOBS = {"ops_impl": OPS_IMPL}

    def setup(self, group, w, device):
        super().setup(group, w, device)
        self.world = dist.get_world_size(group)
        self.impl = self.knob_values.get("ops_impl", "auto")     # "auto": the fastest per op
        L, W = w.local_experts, self.world
        self.to_expert_major = torch.tensor([s * L + j for j in range(L) for s in range(W)], device=device)
        self.to_rank_major = torch.tensor([j * W + s for s in range(W) for j in range(L)], device=device)

    def sms_used(self):
        return exchange_sms(self.group)

    def knobs(self):
        ops_used = {op: (ops.best_impl(self.device, op) if self.impl == "auto" else self.impl)
                    for op in ("permute", "sort_chunks_by_idxs", "unpermute")}
        return {**super().knobs(), "ops_impl": self.impl, "ops": ops_used}

    def _a2a(self, x: torch.Tensor, out_rows: int, out_splits, in_splits) -> torch.Tensor:
        """all_to_all_single on rows; fp8 travels as bytes (NCCL and gloo have no fp8 type)."""
        if self.world == 1:
            return x            # Megatron's _AllToAll is bypassed for one rank as well
        flat = x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x
        out = flat.new_empty((out_rows, *flat.shape[1:]))
        dist.all_to_all_single(out, flat.contiguous(), out_splits, in_splits, group=self.group)
        return out.view(x.dtype) if x.dtype == torch.float8_e4m3fn else out

    def _sorts(self) -> bool:
        """Whether the received chunks need sorting: not with one rank or one local expert."""
        return self.world > 1 and self.w.local_experts > 1

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        w, W, L = self.w, self.world, self.w.local_experts
        T, K = topk_idx_TK.shape
        # the routing weights are permuted in the same launch. One rank: the counts per expert reach the
        # host from the permute's index kernels while its copy runs (the one host sync). Several ranks:
        # T*K rows bound the count, so the permute needs no wait (rows past the count are never sent)
        p = ops.permute(x_TH, topk_idx_TK, w.num_experts, scales_TS=scales_TS, impl=self.impl,
                        num_out_rows=T * K if W > 1 else None, probs_TK=topk_w_TK, counts_to_host=W == 1)
        send_counts = p.tokens_per_expert.view(W, L)
        if W > 1:
            send_counts = send_counts.to(torch.int64)
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts, group=self.group)
            # the split sizes and rows per local expert, summed on the device behind the permute, reach
            # the host in one copy: the one host sync (Megatron has it too), nothing summed in Python
            sizes = torch.cat([send_counts.sum(1), recv_counts.sum(1), recv_counts.sum(0)]).tolist()
            in_splits, out_splits, tokens_per_expert = sizes[:W], sizes[W:2 * W], sizes[2 * W:]
        else:       # one rank: what it sends it receives
            recv_counts = send_counts
            tokens_per_expert = p.tokens_per_expert_host
            in_splits = out_splits = [p.x_RH.shape[0]]
        handle = _Handle(p.row_map_TK, in_splits, out_splits, recv_counts)
        return self._exchange(p, handle, tokens_per_expert)

    def _exchange(self, p: ops.Permuted, h: _Handle, tokens_per_expert) -> Dispatched:
        """The permuted rows (with their probs and scales) to the ranks that hold their experts, then
        sorted into (local expert, source rank) order."""
        S, R = sum(h.input_splits), sum(h.output_splits)
        rows = lambda t: t if t.shape[0] == S else t[:S]  # noqa: E731   (no view op when nothing was dropped)
        x_R = self._a2a(rows(p.x_RH), R, h.output_splits, h.input_splits)
        probs_recv = self._a2a(rows(p.probs_R), R, h.output_splits, h.input_splits)
        scales_R = self._a2a(rows(p.scales_RS), R, h.output_splits, h.input_splits) if p.scales_RS is not None else None
        if self._sorts():
            chunks = h.recv_counts_WL.view(-1)
            sort = lambda t: ops.sort_chunks_by_idxs(t, chunks, self.to_expert_major, impl=self.impl)  # noqa: E731
            x_R, probs_recv = sort(x_R), sort(probs_recv[:, None])[:, 0]
            scales_R = sort(scales_R) if scales_R is not None else None
        return Dispatched(x_R, tokens_per_expert, h, scales_R, probs_recv)

    def combine(self, y_RH, handle: _Handle):
        if self._sorts():
            chunks = handle.recv_counts_WL.t().reshape(-1)
            y_RH = ops.sort_chunks_by_idxs(y_RH, chunks, self.to_rank_major, impl=self.impl)
        back = self._a2a(y_RH, sum(handle.input_splits), handle.input_splits, handle.output_splits)
        return ops.unpermute(back, handle.row_map_TK, None, impl=self.impl)

    def dispatch_known(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, h: _Handle, tokens_per_expert) -> Dispatched:
        """The dispatch with the checked dispatch's splits known: the permute into the send buffer (its row
        count known, so nothing waits for the device), the exchange, the receive-side chunk sort. Only the
        count exchange and the host sync are skipped (what DeepEP's cached call saves)."""
        p = ops.permute(x_TH, topk_idx_TK, self.w.num_experts, scales_TS=scales_TS, impl=self.impl,
                        num_out_rows=sum(h.input_splits), probs_TK=topk_w_TK)
        return self._exchange(p, h, tokens_per_expert)

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """dispatch_known with the checked dispatch's handle; the combine as it is (it needs no metadata)."""
        return {"dispatch": lambda: self.dispatch_known(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d.handle,
                                                        d.tokens_per_expert),
                "combine": lambda: self.combine(y_RH, d.handle)}

    def graph_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """The cached calls: no host sync, and NCCL's all-to-all can be captured (a gloo one cannot)."""
        if self.world > 1 and dist.get_backend(self.group) != "nccl":
            return f"the exchange runs on {dist.get_backend(self.group)}, whose collectives cannot be captured"
        mode = "splits known ahead (the checked dispatch's), " + ("NCCL" if self.world > 1 else "one rank: no exchange")
        return self.cached_graph(mode, self.cached_phases(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH))

    def chained_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """The cached calls on any group: they make no host sync of their own (a gloo exchange blocks the host inside
        the collective: a CPU or shared-GPU run, functional only)."""
        mode = "splits known ahead (the checked dispatch's), " + (
            dist.get_backend(self.group) if self.world > 1 else "one rank: no exchange")
        return self.cached_graph(mode, self.cached_phases(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH))
