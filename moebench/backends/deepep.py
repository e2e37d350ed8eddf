"""`deepep`: DeepEP's legacy `deep_ep.Buffer` (V1 API, what Megatron's flex dispatcher calls), normal
mode (the helpers of the DeepEP family are in backends/deepep_family.py).

Normal mode (`deepep`): get_dispatch_layout -> dispatch -> local grouping. DeepEP returns each
received token once per rank, with `recv_topk_idx` holding local expert ids (-1 elsewhere), not
grouped by expert: moebench groups the rows with `ops.permute` on those ids (Megatron does the
same permute after `fused_dispatch`), each row with its received top-k weight, which the experts apply.
DeepEP's combine is an unweighted sum over ranks, given each received token's unweighted sum over its local
experts (`ops.unpermute` without weights: Megatron's `combine_preprocess`). The layout is also timed as its
own phase (`layout`); `dispatch` includes it, as in Megatron's FusedDispatch. fp8 travels as (e4m3 [T,H], fp32 scales [T,H/128]). `--num-sms` sets
`Buffer.set_num_sms` (even; default 20, Megatron's default too). Timing view `cached`: dispatch
with the checked dispatch's `handle=` and the same Config (no layout, no notify, no CPU wait), as
tests/test_intranode.py times it, then the same local grouping; view `graph`: those calls captured.

Legend: T tokens, H hidden, K top-k, L local experts, N received tokens, R grouped rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.workload import WorkloadError
from ..env.deepep import build_version
from .base import OPS_IMPL, Backend, Dispatched
from .deepep_family import (
    FP8_FACTOR,
    NUM_SMS,
    Grouped,
    bypass_nvlink_check,
    destroy,
    find,
    group_by_local_expert,
    import_deep_ep,
    new_buffer,
    recv_room_bytes,
    unpermuted_rows,
)

# get_dispatch_config's table (2..160, no 48/96) intersected with the kernels' SWITCH_RANKS (2/4/8 in a node)
# and SWITCH_RDMA_RANKS (16/32/64/128/144/160; 24 = 3 RDMA ranks has no kernel) on hybrid-ep and v1.2.1
NORMAL_RANKS = (2, 4, 8, 16, 32, 64, 128, 144, 160)
@dataclass
class _Handle:
    native: object
    grouped: Grouped
    recv_numel: int                # recv_x.numel() of the DeepEP call (its tests' byte rule)
    recv_idx_NK: torch.Tensor      # the received local expert ids and weights: the cached calls group by them
    recv_w_NK: torch.Tensor


class DeepEPBackend(Backend):
    name = "deepep"
    dedup = True
    supports_fp8 = True
    timed_phases = ("dispatch", "combine", "layout")
    KNOBS = {"num_sms": NUM_SMS, "ops_impl": OPS_IMPL}
    # the data kernels, as DeepEP's bench_kineto names them ('dispatch', 'combine'), namespace-qualified so that
    # notify_dispatch / cached_notify* (metadata and barriers) and moebench's own kernels do not match
    comm_kernels = ("intranode::dispatch", "intranode::combine", "internode::dispatch", "internode::combine")

    @classmethod
    def available(cls):
        return find("deep_ep")

    @classmethod
    def version(cls):
        return build_version()

    @classmethod
    def buffer_bytes(cls, w):
        return recv_room_bytes(w)

    def validate(self, w, world):
        super().validate(w, world)
        if world not in NORMAL_RANKS:
            raise WorkloadError(f"deepep (legacy Buffer) runs on 2, 4 or 8 ranks in a node, or "
                                f"{', '.join(map(str, NORMAL_RANKS[3:]))} across nodes; got EP {world}")
        if world > 8 and w.gpus_per_node != 8:
            raise WorkloadError("deepep across nodes needs 8 ranks per node (--gpus-per-node 8)")
        if w.hidden % 8:
            raise WorkloadError(f"deepep moves rows in 16-byte words: --hidden must be a multiple of 8, got {w.hidden}")

    def setup(self, group, w, device):
        super().setup(group, w, device)
        self.deep_ep, Buffer = import_deep_ep("Buffer")
        self.world = torch.distributed.get_world_size(group)
        self.num_sms = int(self.knob_values.get("num_sms") or getattr(Buffer, "num_sms", 20))
        Buffer.set_num_sms(self.num_sms)
        self.num_sms = int(getattr(Buffer, "num_sms", self.num_sms))     # read back: what DeepEP will use
        self.impl = self.knob_values.get("ops_impl", "auto")     # "auto": the fastest per op
        self.idx_dtype = getattr(self.deep_ep, "topk_idx_t", torch.int64)
        if self.ranks_per_gpu > 1:
            self.bypassed.append(bypass_nvlink_check())
        self.buffer = self._make_buffer(Buffer, group, w)

    def _make_buffer(self, Buffer, group, w):
        R, hidden_bytes = self.world, w.hidden * 2
        # one Config per direction for every call (the api and cached views), the ones DeepEP would default to
        self.configs = (Buffer.get_dispatch_config(R), Buffer.get_combine_config(R))
        nvl = max(c.get_nvl_buffer_size_hint(hidden_bytes, R) for c in self.configs)
        rdma = max(c.get_rdma_buffer_size_hint(hidden_bytes, R) for c in self.configs) if R > 8 else 0
        return new_buffer(Buffer, group, nvl, rdma)

    def sms_used(self):
        return getattr(self, "num_sms", None)

    def knobs(self):
        return {**super().knobs(), "num_sms": getattr(self, "num_sms", None), "local_permute_impl": getattr(self, "impl", None)}

    def _layout(self, idx):
        return self.buffer.get_dispatch_layout(idx, self.w.num_experts)

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        idx = topk_idx_TK.to(self.idx_dtype)
        n_rank, n_rdma, n_expert, in_rank, _ = self._layout(idx)
        payload = (x_TH, scales_TS) if scales_TS is not None else x_TH
        recv_x, recv_idx, recv_w, counts, handle, _ = self.buffer.dispatch(
            payload, topk_idx=idx, topk_weights=topk_w_TK.float(), num_tokens_per_rank=n_rank,
            num_tokens_per_rdma_rank=n_rdma, is_token_in_rank=in_rank, num_tokens_per_expert=n_expert,
            config=self.configs[0])
        recv_s = None
        if isinstance(recv_x, tuple):
            recv_x, recv_s = recv_x
        g = group_by_local_expert(recv_x, recv_idx, recv_w, self.w.local_experts, recv_s,
                                  num_rows=int(sum(counts)), impl=self.impl)
        return Dispatched(g.x_RH, list(counts), _Handle(handle, g, recv_x.numel(), recv_idx, recv_w), g.scales_RS,
                          g.probs_R)

    def combine(self, y_RH, handle: _Handle):
        out = self.buffer.combine(unpermuted_rows(y_RH, handle.grouped, self.impl), handle.native,
                                  config=self.configs[1])
        return out[0]

    def extra_phases(self, x_TH, topk_idx_TK, topk_w_TK):
        idx = topk_idx_TK.to(self.idx_dtype)
        return {"layout": lambda: self._layout(idx)}

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """test_intranode's timed dispatch, dispatch(x, handle=, config=) (no layout, no notify, no CPU wait:
        the rows arrive in the checked dispatch's order), then the local grouping with the row count known;
        the combine needs no metadata, so it is the api call."""
        h: _Handle = d.handle
        payload = (x_TH, scales_TS) if scales_TS is not None else x_TH
        rows = int(sum(d.tokens_per_expert))

        def dispatch():
            recv = self.buffer.dispatch(payload, handle=h.native, config=self.configs[0])[0]
            recv_x, recv_s = recv if isinstance(recv, tuple) else (recv, None)
            g = group_by_local_expert(recv_x, h.recv_idx_NK, h.recv_w_NK, self.w.local_experts, recv_s,
                                      num_rows=rows, impl=self.impl)
            return Dispatched(g.x_RH, d.tokens_per_expert, h, g.scales_RS, g.probs_R)
        return {"dispatch": dispatch, "combine": lambda: self.combine(y_RH, h)}

    def graph_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        if self.world > 8:
            return "across nodes DeepEP's cached dispatch was not checked for host syncs here (not captured)"
        return self.cached_graph("cached handle, intranode (no layout, no notify, no CPU wait)",
                                 self.cached_phases(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH))

    def native_bytes(self, d):
        """test_intranode's dispatch_bf16_nvl_recv_bytes = recv_x.numel() * 2, fp8 x (1 + 4/128) / 2."""
        return round(d.handle.recv_numel * 2 * (FP8_FACTOR if self.w.dtype == "fp8" else 1))

    def teardown(self):
        destroy(getattr(self, "buffer", None))
        self.buffer = None
