"""`ncclep`: NVIDIA's NCCL EP (`nccl.ep` from the nccl-extensions wheel), the dispatcher Megatron-Core 0.19 reaches
as `--moe-flex-dispatcher-backend ncclep` through Transformer Engine. Knob `mode`: `ht` (high-throughput, training
batches) or `ll` (low-latency, decode batches); `--num-sms` is the group's max_num_sms (0: NCCL EP's default).

ht: a HIGH_THROUGHPUT group and an EXPERT_MAJOR handle. The handle's routing exchange (create_handle, then update
per routing: an all-gather of the routing) fills the per-local-expert row counts; dispatch writes one row per
(token, local expert), grouped by expert, with that slot's routing weight, which the experts apply (Megatron's
experts take NCCL EP's dispatched probs); combine sums each token's rows back, unweighted. The receive budget is
fixed, as ep_bench sets it (EP x tokens x top-k rows, the expert-major worst case, ep_bench.cu:5151-5163): the
outputs are allocated once and dispatch needs no host wait before it. Knob `zero_copy` (ht; on by default) is
Megatron-Core 0.19's `--moe-ncclep-static-shape --moe-ncclep-zero-copy`: the counts stay on the device (the experts
run on the whole budget), the experts write their output straight into the buffer combine reads, and that buffer
and dispatch's output are NCCL windows on NCCL EP's communicator (ncclMemAlloc + a symmetric registration, with
GroupConfig.zero_copy ON: the library's token staging is elided, docs/zero-copy.md) where the platform registers
windows (else the library stages them: the record's `library_zero_copy` says why). `zero_copy=0` is Megatron's
path without them: the api dispatch reads the counts on the host (the rows a step hands its experts) and combine
first copies the expert rows into its buffer (Megatron's re-expansion).
ll: a LOW_LATENCY group and an EXPERT_MAJOR handle: dispatch fills [L, R*T, H] slots with per-expert counts (as
DeepEP's low-latency mode), handed to the experts as they are (Dispatched.slots: a masked grouped GEMM reads them
so); the experts write into the slots combine reads, and combine weighs each row in its kernel
(CombineOutputs.topk_weights: its dispatch carries no weights, probs_in_combine). Nothing is gathered or copied in
a timed call.
fp8 (both modes): the caller's e4m3 rows and fp32 scales forwarded byte for byte (DispatchQuantizationRecipe.FWD),
so the oracle checks them bit for bit.

Timing, as NCCL EP's ep_bench: its timed loop runs dispatch and combine with the handle's routing bound before it
("update_fn() is excluded from timed iters"): the `cached` view (and `chained`, its pairs free-running); `api` adds
the update (and, with zero_copy=0, the host wait). Its byte
rules (traffic.upstream_bytes): ht counts received (source rank, token) pairs, own rank included, x payload, which
is moebench's algbw; ll (since nccl-extensions 412ac5f) counts dispatch as (token, destination rank) messages and
combine as valid (token, k) selections, x payload (`ncclep_ll_bytes`). `graph`: ll bf16 (no host sync); ht's
api call reads the counts on the host, and its cached call is what the graph would replay.
max_token_bytes covers dispatch and combine rows (nccl_ep.h: "Upper bound on token-row bytes per token, covering
dispatch and combine"; ep_bench takes the max of both): fp8 dispatch rows are smaller than combine's bf16 ones.
SMs: `--num-sms` is the group's max_num_sms; unset (or 0), NCCL EP's default (AUTO): its communication kernels on 16
SMs for ht (NCCL_EP_HT_DFLT_NUM_SMS) and every SM for ll, its local shuffle (ht's receiver fan-out and reduce) and
preprocessing on every SM; a count N puts the communication and the shuffle on N, the preprocessing still on every SM
(nccl_ep.cc:1749-1782), NCCL_EP_COMM_SMS overriding the communication's count: the record names the communication's
count (`num_sms_used`) and the split (`sms_split`). So ht's default is no explicit count: on the H100 at 565af70
`num_sms=16` took 1317 / 1049 us (its local dup / reduce 1003 / 907 us on 16 SMs) where the default took 455 / 329.

Legend: T tokens, H hidden, K top-k, L local experts, R ranks (ll slots) or grouped rows, S scale columns.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..core.reference import expert_factors
from ..core.workload import WorkloadError, fp8_dequantize
from ..env.toolkit import dist_version, installed, package_file
from .base import SWITCH, Dispatched, GraphPlan, Knob, Unavailable
from .nccl_family import NcclFamily, native_output
from .nccl_windows import Windows

MODES = ("ht", "ll")
HT_MAX_TOKENS = 8192          # MAX_SUPPORTED_TOKENS_PER_RANK (nccl_ep include/common.hpp, RELEASE.md)
LL_MAX_TOPK = 32              # MAX_NUM_TOPK
HT_DEFAULT_SMS = 16           # NCCL_EP_HT_DFLT_NUM_SMS (nccl_ep device/ht_ep_configs.cuh:17)
SMS_ENV = "NCCL_EP_COMM_SMS"  # the library's override of the resolved SM count (nccl_ep_env.h:57)
INSTALL = ("pip install 'nccl-extensions[cu13]' (nccl.ep; it runs on the libnccl the process loaded, which must be "
           "NCCL >= 2.30.4)")


@dataclass
class _Handle:
    native: object                 # nccl.ep.Handle, bound to this dispatch's routing
    rows: int | None = None        # ht, zero_copy=0: the rows the experts returned (copied into combine's buffer)
    topk_w: torch.Tensor | None = None      # ll: combine weighs in the kernel


class NcclEPBackend(NcclFamily):
    name = "ncclep"
    dedup = True                   # ht and ll dispatch send one message per (token, destination rank)
    supports_fp8 = True
    KNOBS = {"mode": Knob(choices=MODES), "num_sms": Knob(low=0), "zero_copy": SWITCH}
    comm_kernels = ("dispatch", "combine")     # ep_bench's kernel-time names (CUPTI): NCCL EP's JIT kernels
    cached_loop = "ep_bench"
    no_graph_view = ("ht is not captured here: its routing exchange (handle update) is not known to be graph-safe, and "
                     "zero_copy=0 reads the counts on the host; its cached pair is timed free-running (chained)")

    @classmethod
    def available(cls):
        return (True, "") if installed("nccl.ep") else (False, f"nccl-extensions not installed; {INSTALL}")

    @classmethod
    def version(cls):
        return dist_version("nccl-extensions") or ""

    @classmethod
    def cpu_problem(cls, knob_values):
        return "NCCL EP runs on CUDA GPUs only (its kernels are compiled for the GPU at run time)"

    @classmethod
    def buffer_bytes(cls, w):
        """ht: received rows (one per (token, local expert)) at worst; ll: the slots of dispatch and of combine."""
        rows = w.ep * w.num_tokens
        return rows * min(w.topk, w.local_experts) * w.bytes_per_token + rows * w.local_experts * 2 * w.hidden

    @property
    def mode(self) -> str:
        return self.knob_values.get("mode", "ht")

    @property
    def zero_copy(self) -> bool:
        """ht: Megatron's static shape + zero-copy (knob zero_copy, default on); ll has no such path."""
        return self.mode == "ht" and bool(self.knob_values.get("zero_copy", 1))

    @property
    def probs_in_combine(self) -> str:
        return ("NCCL EP's LL expert-major combine weighs each row by CombineOutputs.topk_weights on the receive side "
                "(its dispatch carries no weights)") if self.mode == "ll" else ""

    def validate(self, w, world):
        super().validate(w, world)
        if self.knob_values.get("zero_copy") == 1:
            why = zero_copy_problem(self.mode)
            if why:
                raise WorkloadError(f"ncclep zero_copy=1: {why}")
        row_bytes = w.hidden * (1 if w.dtype == "fp8" else 2)
        if row_bytes % 16:
            raise WorkloadError(f"ncclep moves rows in 16-byte words: {w.dtype} rows of --hidden {w.hidden} are "
                                f"{row_bytes} bytes")
        if w.dtype == "fp8" and (w.hidden // 128) % 4:
            raise WorkloadError(f"ncclep forwards fp8 scales in 16-byte rows: --hidden must be a multiple of 512, got "
                                f"{w.hidden}")
        if self.mode == "ht":
            if w.num_tokens > HT_MAX_TOKENS:
                raise WorkloadError(f"ncclep ht takes at most {HT_MAX_TOKENS} tokens per rank, got {w.num_tokens}")
            team = min(world, w.gpus_per_node)
            if (w.local_experts * team) % 4:
                raise WorkloadError(f"ncclep ht needs the experts of a node ({w.local_experts} local x {team} ranks) to "
                                    "be a multiple of 4")
        else:
            if w.topk > LL_MAX_TOPK:
                raise WorkloadError(f"ncclep ll takes --topk <= {LL_MAX_TOPK}, got {w.topk}")
            if w.hidden % 128:
                raise WorkloadError(f"ncclep ll combines rows of --hidden divisible by 128, got {w.hidden}")
            sms = self.knob_values.get("num_sms")
            if sms and -(-w.num_experts // sms) > 14:
                raise WorkloadError(f"ncclep ll needs --num-sms >= {-(-w.num_experts // 14)} for {w.num_experts} "
                                    f"experts (at most 14 warp groups per SM), got {sms}")

    def setup(self, group, w, device):
        super().setup(group, w, device)
        self.nccl_setup("ncclep (NCCL EP)")
        try:
            import nccl.ep as ep
            from nccl.ep.interop.torch import get_nccl_comm_from_group
        except Exception as e:  # noqa: BLE001 - any import failure: this run cannot use it
            raise Unavailable(f"import nccl.ep failed: {type(e).__name__}: {e}; {INSTALL}") from e
        self.ep, self.world = ep, torch.distributed.get_world_size(group)
        self.fp8 = w.dtype == "fp8"
        ht = self.mode == "ht"
        self.budget = self.world * w.num_tokens * w.topk if ht else 0
        self.comm = self.group_ep = self.handle = self.windows = None
        with native_output("ncclep: NCCL communicator, windows and EP group"):
            self.comm = get_nccl_comm_from_group(group)
            self._buffers(w, device)
            cfg = ep.GroupConfig(
                algorithm=ep.Algorithm.HIGH_THROUGHPUT if ht else ep.Algorithm.LOW_LATENCY,
                num_experts=w.num_experts, max_dispatch_tokens_per_rank=w.num_tokens,
                max_recv_tokens_per_rank=self.budget, max_token_bytes=token_bytes(w),
                max_num_sms=int(self.knob_values.get("num_sms") or 0), num_topk=w.topk,
                **({"zero_copy": ep.ZeroCopyMode.ON} if self.windows and self.windows.ok else {}))
            self.library_zero_copy = self.windows.state() if self.windows else None    # kept past teardown
            self.group_ep = ep.Group.create(self.comm, cfg)

    def _buffers(self, w, device):
        """The outputs and combine's input, once: ht the budget's rows (NCCL windows with zero_copy, where the
        platform registers them), ll the [L, R*T] slots."""
        L, row = w.local_experts, torch.float8_e4m3fn if self.fp8 else torch.bfloat16
        if self.mode == "ll":
            slots = (L, self.world * w.num_tokens)
            self.counts = torch.zeros(L, dtype=torch.int32, device=device)
            self.recv = torch.empty(*slots, w.hidden, dtype=row, device=device)
            self.recv_s = torch.empty(*slots, w.hidden // 128, dtype=torch.float32, device=device) if self.fp8 else None
            self.combine_in = torch.empty(*slots, w.hidden, dtype=torch.bfloat16, device=device)
            return
        self.counts = torch.zeros(L, dtype=torch.int64, device=device)
        self.total = torch.zeros(1, dtype=torch.int64, device=device)
        self.weights = torch.empty(self.budget, dtype=torch.float32, device=device)
        make = lambda shape, dtype: torch.empty(shape, dtype=dtype, device=device)   # noqa: E731
        if self.zero_copy:
            old = "" if hasattr(self.ep, "ZeroCopyMode") else "this NCCL EP has no ZeroCopyMode"
            self.windows = Windows(self.comm, self.group, device, old)
            make = self.windows.empty
        self.rows = make((self.budget, w.hidden), row)
        self.rows_s = make((self.budget, w.hidden // 128), torch.float32) if self.fp8 else None
        self.combine_in = make((self.budget, w.hidden), torch.bfloat16)

    def sms_used(self):
        """The SMs NCCL EP's kernels use (its resolution of max_num_sms, nccl_ep.cc:1749-1782)."""
        if self.knob_values.get("num_sms"):
            return int(self.knob_values["num_sms"])
        device_sms = torch.cuda.get_device_properties(self.device).multi_processor_count \
            if getattr(self, "device", None) is not None and self.device.type == "cuda" else None
        env = os.environ.get(SMS_ENV, "")
        if env.isdigit() and device_sms and 1 <= int(env) <= device_sms:
            return int(env)
        return HT_DEFAULT_SMS if self.mode == "ht" else device_sms

    def sms_split(self) -> str:
        """Where NCCL EP puts its kernels (nccl_ep.cc:1749-1782): the communication's SMs, the local shuffle's and the
        preprocessing's (every SM, unless the library's own environment says otherwise)."""
        n = self.knob_values.get("num_sms")
        shuffle = f"{n}" if n else "every SM"
        return f"communication {self.sms_used() or 'every SM'}, local shuffle {shuffle}, preprocessing every SM"

    def knobs(self):
        zc = {"zero_copy": int(self.zero_copy), "library_zero_copy": getattr(self, "library_zero_copy", None),
              "megatron": MEGATRON_ZERO_COPY if self.zero_copy else None} if self.mode == "ht" else {}
        return {**super().knobs(), "mode": self.mode, **zc, "sms_split": self.sms_split(),
                "libnccl": getattr(self, "nccl", None),
                "max_recv_tokens_per_rank": getattr(self, "budget", None),
                "nccl_ep_lib": str(self.ep.get_lib_version()) if hasattr(self, "ep") else None}

    # -------------------------------------------------------------------- calls
    def _stream(self):
        return torch.cuda.current_stream().cuda_stream if self.device.type == "cuda" else None

    def _bind(self, idx_TK):
        """The handle's routing: created once, then updated (the routing exchange); ht fills the counts."""
        T, info = self.ep.Tensor, None
        if self.mode == "ht":
            info = self.ep.LayoutInfo(expert_counters=T(self.counts), recv_total_counter=T(self.total))
        idx = T(idx_TK.to(torch.int64).contiguous())
        if self.handle is None:
            self.handle = self.group_ep.create_handle(self.ep.Layout.EXPERT_MAJOR, idx, layout_info=info,
                                                      stream=self._stream())
        else:
            self.handle.update(idx, layout_info=info, stream=self._stream())
        self._idx = idx                           # the bound routing's tensor outlives the call

    def _config(self):
        q = self.ep.DispatchQuantizationRecipe.FWD if self.fp8 else self.ep.DispatchQuantizationRecipe.NONE
        return self.ep.DispatchConfig(quantization_recipe=q)

    def _t(self, t):
        """t's descriptor: window-backed where t is one of the windows (zero copy)."""
        return self.windows.tensor(t) if self.windows else self.ep.Tensor(t)

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        with self.first_call("dispatch"):
            self._bind(topk_idx_TK)
            if self.mode == "ht":
                return self._ht(x_TH, topk_w_TK, scales_TS)
            return self._ll(x_TH, topk_w_TK, scales_TS)

    def _ht(self, x_TH, topk_w_TK, scales_TS, counts=None):
        """Into the fixed budget. zero_copy: the whole budget with the counts on the device (static shape); else the
        rows of the counts, read on the host after the dispatch (the api call's one host wait) unless given."""
        T = self.ep.Tensor
        self.handle.dispatch(
            self.ep.DispatchInputs(tokens=T(x_TH), topk_weights=T(topk_w_TK.float().contiguous()),
                                   scales=T(scales_TS) if scales_TS is not None else None),
            self.ep.DispatchOutputs(tokens=self._t(self.rows), topk_weights=T(self.weights),
                                    scales=self._t(self.rows_s) if scales_TS is not None else None),
            config=self._config(), stream=self._stream())
        if self.zero_copy:
            return Dispatched(self.rows, self.counts, _Handle(self.handle), self.rows_s, self.weights)
        counts = counts if counts is not None else [int(c) for c in self.counts.tolist()]
        n = sum(counts)
        return Dispatched(self.rows[:n], counts, _Handle(self.handle, rows=n),
                          self.rows_s[:n] if scales_TS is not None else None, self.weights[:n])

    def _ll(self, x_TH, topk_w_TK, scales_TS):
        """Into the fixed slots, handed over as they are with the counts the dispatch wrote (on the device)."""
        T = self.ep.Tensor
        self.handle.dispatch(
            self.ep.DispatchInputs(tokens=T(x_TH), scales=T(scales_TS) if scales_TS is not None else None),
            self.ep.DispatchOutputs(tokens=T(self.recv), scales=T(self.recv_s) if self.fp8 else None),
            layout_info=self.ep.LayoutInfo(expert_counters=T(self.counts)), config=self._config(),
            stream=self._stream())
        return Dispatched(self.recv, self.counts, _Handle(self.handle, topk_w=topk_w_TK.float()), self.recv_s,
                          slots=True)

    def expert_buffer(self, d):
        """The buffer combine reads: ll's slots, ht's with zero_copy (else the experts return rows of their own)."""
        return self.combine_in if self.mode == "ll" or self.zero_copy else None

    def combine(self, y_RH, handle: _Handle):
        with self.first_call("combine"):
            out = self._combine(y_RH, handle)
        self.first = False
        return out

    def _combine(self, y_RH, h: _Handle):
        T = self.ep.Tensor
        out = torch.empty(self.w.num_tokens, self.w.hidden, dtype=torch.bfloat16, device=y_RH.device)
        if self.expert_buffer(None) is None:             # Megatron without zero-copy: its re-expansion's copy
            self.combine_in[: h.rows].copy_(y_RH[: h.rows])
        elif y_RH.data_ptr() != self.combine_in.data_ptr():
            raise ValueError("ncclep: the expert outputs must be written into the buffer combine reads "
                             "(Backend.expert_buffer)")
        weights = T(h.topk_w.contiguous()) if self.mode == "ll" else None
        h.native.combine(self.ep.CombineInputs(tokens=self._t(self.combine_in)),
                         self.ep.CombineOutputs(tokens=T(out), topk_weights=weights), stream=self._stream())
        return out

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """ep_bench's timed dispatch: the handle keeps the checked dispatch's routing (no update, no host wait: the
        counts are known), then the same outputs; combine is the api call."""
        h: _Handle = d.handle
        if self.mode == "ht":
            counts = None if self.zero_copy else list(d.tokens_per_expert)
            dispatch = lambda: self._ht(x_TH, topk_w_TK, scales_TS, counts)            # noqa: E731
        else:
            dispatch = lambda: self._ll(x_TH, h.topk_w, scales_TS)                     # noqa: E731
        return {"dispatch": dispatch, "combine": lambda: self._combine(y_RH, h)}

    def chained_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """ht: ep_bench's pair (the routing bound, no host wait in either call), queued free-running, the correctness
        expert between them on that dispatch's own rows; ll: the graph's pair, likewise. A row's place within its
        expert follows arrival order (ll's slots; ht with zero copy, whose receivers fan the tokens out), so the
        checked dispatch's expert outputs would not fit another dispatch's handle (measured: wrong combines)."""
        if self.mode == "ll":
            return super().chained_plan(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH)
        calls = self.cached_phases(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH)
        factor = expert_factors(torch.distributed.get_rank(self.group), self.w, self.device)
        row = torch.arange(self.budget, device=self.device)

        def between(dg):            # each budget row's expert from the counts on the device, then (e + 1) x its prob
            e = torch.searchsorted(torch.cumsum(self.counts, 0), row, right=True).clamp_(max=self.w.local_experts - 1)
            x = fp8_dequantize(self.rows, self.rows_s) if self.fp8 else self.rows
            torch.mul(x, (factor[e] * self.weights)[:, None], out=self.combine_in)
        return GraphPlan("ep_bench's pair: the routing bound once, no host wait; the expert on each dispatch's rows",
                         calls["dispatch"], lambda dg: self._combine(self.combine_in, dg.handle), between)

    def graph_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """ll bf16: dispatch into the slots, the correctness expert on the slots (captured between), combine of those
        slots: no host sync. ht has none (no_graph_view); ll fp8's expert outputs would need dequantizing per slot."""
        if self.mode == "ht":
            return self.no_graph_view
        if self.fp8:
            return "ll fp8: the expert outputs are not a multiply of the received slots (fp8 with scales)"
        factor = expert_factors(torch.distributed.get_rank(self.group), self.w, self.device, torch.bfloat16)
        h = _Handle(self.handle, topk_w=topk_w_TK.float())

        def between(dg):
            torch.mul(self.recv, factor[:, None, None], out=self.combine_in)
        return GraphPlan("ll: dispatch + combine into fixed slots (no host sync), captured as a pair",
                         lambda: self._ll(x_TH, topk_w_TK, None), lambda dg: self._combine(self.combine_in, h),
                         between)

    def teardown(self):
        """Handle, group, the windows, then the communicator get_nccl_comm_from_group made for this backend."""
        for obj in (getattr(self, "handle", None), getattr(self, "group_ep", None), getattr(self, "windows", None),
                    getattr(self, "comm", None)):
            if obj is not None:
                obj.destroy()
        self.handle = self.group_ep = self.windows = self.comm = None


def token_bytes(w) -> int:
    """max_token_bytes: the larger of a dispatch row (payload + fp8 scales) and combine's bf16 row, to 16 bytes."""
    return -(-max(w.bytes_per_token, 2 * w.hidden) // 16) * 16


MEGATRON_ZERO_COPY = ("Megatron-Core 0.19 --moe-ncclep-static-shape --moe-ncclep-zero-copy (zero-copy requires static "
                      "shape: token_dispatcher.py _NCCLEPManager)")


def zero_copy_problem(mode: str) -> str:
    """Why ncclep cannot run zero_copy=1 here ('' when it can): ll has no such path, or the installed NCCL EP has no
    ZeroCopyMode (read from its files: nothing is imported)."""
    if mode == "ll":
        return "ll has no zero-copy combine (NCCL EP's LL combine always stages; Megatron's zero-copy is ht's)"
    enums = package_file("nccl.ep", "enums.py")
    if enums is not None and "class ZeroCopyMode" not in enums.read_text(errors="replace"):
        return (f"this NCCL EP (nccl-extensions {dist_version('nccl-extensions') or '?'}) has no ZeroCopyMode (windowed "
                "dispatch output and combine input): use zero_copy=0 or a newer nccl-extensions")
    return ""
