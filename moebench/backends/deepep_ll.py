"""`deepep-ll`: DeepEP's legacy `deep_ep.Buffer` in low-latency mode (needs a DeepEP built with NVSHMEM).

Low-latency mode (`deepep-ll`): low_latency_dispatch returns [L, max_tokens*R, H] slots per local expert
with counts, which is what DeepEP's low-latency users hand their experts (a masked grouped GEMM over the
counts): dispatch returns the slots as they are (Dispatched.slots), the experts write their outputs into
the slots of one [L, max_tokens*R, H] buffer allocated at setup (expert_buffer; the kernel reads only the
received slots), and combine is low_latency_combine of that buffer, which applies the top-k weights in
its kernel (its dispatch carries none: probs_in_combine). No gather, scatter or host wait is timed.
Timing view `cached`: low_latency_dispatch as tests/test_low_latency.py times it; view `graph`: a
dispatch + combine pair captured (graph_plan). LL sends one copy per
(token, expert) (dedup False), needs NVSHMEM, and runs bf16 here: its fp8 quantizes inside the
kernel, so its payload is not the oracle's. With ranks sharing a GPU it runs as well (NVSHMEM's P2P
transport reaches a PE on the same device), functional only like every shared-GPU figure.

Legend: T tokens, H hidden, K top-k, L local experts, R grouped rows, M slots per local expert
(max_tokens * ranks).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..core.reference import expert_factors
from ..core.workload import WorkloadError
from .base import Backend, Dispatched, GraphPlan
from .deepep import DeepEPBackend
from .deepep_family import new_buffer

LL_HIDDEN = (2048, 2560, 4096, 5120, 6144, 7168, 8192)   # SWITCH_HIDDEN in csrc/kernels/launch.cuh (no 3072)
LL_MAX_TOPK = 11
LL_MAX_BUFFER_GiB = 16.0
QP_DEPTH_ENV = "NVSHMEM_QP_DEPTH"
QP_DEPTH_DEFAULT = 1024             # what Buffer sets when the variable is unset


@dataclass
class _LLHandle:
    native: object
    topk_idx: torch.Tensor
    topk_w: torch.Tensor


def ll_qp_depth(num_tokens: int) -> int:
    """NVSHMEM QP depth the LL kernels need: DeepEP main asserts depth >= 2 (T + 1) (so that the WRs
    in flight never exceed the queue); hybrid-ep and v1.2.1 leave it at 1024 and do not check."""
    return 2 * (num_tokens + 1)


def qp_depth_problem(num_tokens: int, env=os.environ) -> str | None:
    """Why the NVSHMEM_QP_DEPTH the user set cannot serve T tokens per rank, else None."""
    v, need = env.get(QP_DEPTH_ENV), ll_qp_depth(num_tokens)
    if v is None:
        return None
    if not v.strip().isdigit():
        return f"{QP_DEPTH_ENV}={v!r} is not a positive integer"
    if int(v) < need:
        return (f"{QP_DEPTH_ENV}={v} is below the {need} = 2 x (--num-tokens + 1) that DeepEP's low-latency kernels "
                f"need: raise it, or unset it and moebench sets {need}")
    return None


class DeepEPLowLatencyBackend(DeepEPBackend):
    name = "deepep-ll"
    dedup = False                      # one copy per (token, expert)
    supports_fp8 = False
    timed_phases = ("dispatch", "combine")
    comm_kernels = ("internode_ll::dispatch", "internode_ll::combine")   # test_low_latency's 'dispatch', 'combine'
    probs_in_combine = ("DeepEP's low_latency_combine weighs each expert row by topk_weights in its kernel (its "
                        "dispatch carries no weights)")

    @classmethod
    def buffer_bytes(cls, w):
        """Its RDMA buffer and the [E, T, H] bf16 receive slots."""
        return ll_buffer_bytes(w) + w.num_experts * w.num_tokens * 2 * w.hidden

    def validate(self, w, world):
        Backend.validate(self, w, world)
        if world < 2:
            raise WorkloadError(f"deepep-ll needs 2+ ranks, got EP {world}")
        if w.hidden not in LL_HIDDEN:
            raise WorkloadError(f"deepep-ll supports --hidden in {LL_HIDDEN}, got {w.hidden}")
        if w.topk > LL_MAX_TOPK:
            raise WorkloadError(f"deepep-ll supports --topk <= {LL_MAX_TOPK}, got {w.topk}")
        if (world * w.num_tokens) % 4:
            raise WorkloadError(f"deepep-ll needs EP x --num-tokens divisible by 4 (its TMA copies), got {world} x "
                                f"{w.num_tokens}")
        problem = qp_depth_problem(w.num_tokens)
        if problem:
            raise WorkloadError(f"deepep-ll: {problem}")
        gib = ll_buffer_bytes(w) / 2**30
        if gib > LL_MAX_BUFFER_GiB:
            raise WorkloadError(f"deepep-ll would need ~{gib:.0f} GiB per rank (receive slots for every expert x "
                                f"tokens x ranks); low-latency mode is for small batches: lower --num-tokens")

    def _make_buffer(self, Buffer, group, w):
        R, L = self.world, w.local_experts
        if QP_DEPTH_ENV not in os.environ and ll_qp_depth(w.num_tokens) > QP_DEPTH_DEFAULT:
            os.environ[QP_DEPTH_ENV] = str(ll_qp_depth(w.num_tokens))   # read by NVSHMEM's init, inside Buffer()
        self.qp_depth = int(os.environ.get(QP_DEPTH_ENV, QP_DEPTH_DEFAULT))
        rdma = Buffer.get_low_latency_rdma_size_hint(w.num_tokens, w.hidden, R, w.num_experts)
        buffer = new_buffer(Buffer, group, 0, rdma, low_latency_mode=True, num_qps_per_rank=max(1, w.num_experts // R))
        # combine's input [L, M, H]: once; each combine writes only the received slots, all the kernel reads
        self.combine_in = torch.empty(L, R * w.num_tokens, w.hidden, dtype=torch.bfloat16, device=self.device)
        return buffer

    def sms_used(self):
        """DeepEP's low-latency kernels: ceil(E / warp groups), warp groups = ceil(E / device SMs)
        (csrc/kernels/internode_ll.cu dispatch and combine launchers)."""
        if getattr(self, "device", None) is None or self.device.type != "cuda":
            return None
        E, sms = self.w.num_experts, torch.cuda.get_device_properties(self.device).multi_processor_count
        return -(-E // -(-E // sms))

    def knobs(self):
        return {**Backend.knobs(self), "local_permute_impl": getattr(self, "impl", None),
                "nvshmem_qp_depth": getattr(self, "qp_depth", None)}

    def _raw(self, x_TH, idx):
        return self.buffer.low_latency_dispatch(x_TH, idx, self.w.num_tokens, self.w.num_experts, use_fp8=False,
                                                async_finish=False, return_recv_hook=False)

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        idx = topk_idx_TK.to(self.idx_dtype)
        recv_x, recv_count, handle, _, _ = self._raw(x_TH, idx)
        return Dispatched(recv_x, recv_count, _LLHandle(handle, idx, topk_w_TK.float()), slots=True)

    def expert_buffer(self, d):
        return self.combine_in

    def combine(self, y_LMH, handle: _LLHandle):
        """low_latency_combine of the slots the experts wrote (expert_buffer); it weighs them itself."""
        return self.buffer.low_latency_combine(y_LMH, handle.topk_idx, handle.topk_w, handle.native)[0]

    def extra_phases(self, x_TH, topk_idx_TK, topk_w_TK):
        return {}

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """test_low_latency's timed dispatch, low_latency_dispatch (the routing converted once); the combine is the
        api call."""
        h: _LLHandle = d.handle

        def dispatch():
            recv_x, recv_count, native, _, _ = self._raw(x_TH, h.topk_idx)
            return Dispatched(recv_x, recv_count, _LLHandle(native, h.topk_idx, h.topk_w), slots=True)
        return {"dispatch": dispatch, "combine": lambda: self.combine(y_RH, h)}

    def graph_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """The low-latency calls make no host sync. A combine must use its own dispatch's handle (slots are
        filled in arrival order), so the captured combine takes the captured dispatch's slots, multiplied by
        the correctness expert between the two; the pair keeps DeepEP's double-buffer parity."""
        h: _LLHandle = d.handle
        factor = expert_factors(torch.distributed.get_rank(self.group), self.w, self.device, torch.bfloat16)
        slots_in = torch.empty_like(self.combine_in)       # the api's expert output (combine_in) stays as it is

        def dispatch():
            recv_x, _, native, _, _ = self._raw(x_TH, h.topk_idx)
            return Dispatched(recv_x, d.tokens_per_expert, _LLHandle(native, h.topk_idx, h.topk_w), slots=True)

        def between(dg):
            torch.mul(dg.x_RH, factor[:, None, None], out=slots_in)

        return GraphPlan("low-latency dispatch + combine (no host sync), captured as a pair", dispatch,
                         lambda dg: self.combine(slots_in, dg.handle), between)

    def native_bytes(self, d):
        """None: the LL receive tensor is padded ([L, max_tokens * R, H]), so recv_x.numel() is no byte
        count; its test's per-slot rule is traffic.upstream_bytes' deepep_ll_bytes."""
        return None


def ll_buffer_bytes(w) -> int:
    """LL RDMA buffer per rank, as DeepEP's LowLatencyLayout (csrc/config.hpp) sizes it: two send, two
    receive and two signalling buffers; send = max(T dispatch messages, E x T combine messages),
    receive = E x T of the larger message; dispatch message = 16 + max(2H, H + H/128 x 4) bytes,
    combine message = 2H + H/128 x 4; rounded up as get_low_latency_rdma_size_hint does."""
    T, H, E = w.num_tokens, w.hidden, w.num_experts
    scales = H // 128
    dispatch_msg = 16 + max(2 * H, H + scales * 4)
    combine_msg = scales * 4 + 2 * H
    send = max(T * dispatch_msg, E * T * combine_msg)
    recv = E * T * max(dispatch_msg, combine_msg)
    signal = -(-E * 4 // 128) * 128
    total = 2 * (send + recv + signal)
    return (total + 128) // 128 * 128
