"""`deepep`: DeepEP's legacy `deep_ep.Buffer` (V1 API, what Megatron's flex dispatcher calls), normal
mode; the helpers it shares with `deepep-ll` (backends/deepep_ll.py) and `hybridep`.

Normal mode (`deepep`): get_dispatch_layout -> dispatch -> local grouping. DeepEP returns each
received token once per rank, with `recv_topk_idx` holding local expert ids (-1 elsewhere), not
grouped by expert: moebench groups the rows with `ops.permute` on those ids (Megatron does the
same permute after `fused_dispatch`). DeepEP's combine is an unweighted sum over ranks, so the
weights are applied before it, during the local unpermute (`ops.unpermute` with the received top-k
weights). The layout is also timed as its own phase (`layout`); `dispatch` includes it, as in
Megatron's FusedDispatch. fp8 travels as (e4m3 [T,H], fp32 scales [T,H/128]). `--num-sms` sets
`Buffer.set_num_sms` (even; default 20, Megatron's default too). Timing view `cached`: dispatch
with the checked dispatch's `handle=` and the same Config (no layout, no notify, no CPU wait), as
tests/test_intranode.py times it, then the same local grouping; view `graph`: those calls captured.

Legend: T tokens, H hidden, K top-k, L local experts, N received tokens, R grouped rows.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass

import torch

from .. import ops
from ..core.workload import WorkloadError
from ..env.deepep import HINT, NO_NVSHMEM, build_version
from .base import OPS_IMPL, Backend, Dispatched, Knob, Unavailable

# get_dispatch_config's table (2..160, no 48/96) intersected with the kernels' SWITCH_RANKS (2/4/8 in a node)
# and SWITCH_RDMA_RANKS (16/32/64/128/144/160; 24 = 3 RDMA ranks has no kernel) on hybrid-ep and v1.2.1
NORMAL_RANKS = (2, 4, 8, 16, 32, 64, 128, 144, 160)
NVLINK_BYPASS = ("check_nvlink_connections in deep_ep.Buffer's module (NVML has no NVLink P2P status "
                 "of a GPU with itself)")
FP8_FACTOR = (1 + 4 / 128) / 2      # DeepEP's and HybridEP's tests: fp8 bytes = bf16 bytes x this
NUM_SMS = Knob(low=2, even=True)    # Buffer.set_num_sms takes an even count


def find(module: str) -> tuple[bool, str]:
    """find_spec only (never imports): (False, why) when the package is absent."""
    try:
        ok = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as e:
        return False, f"{module}: {e}"
    return (True, "") if ok else (False, f"{module} not installed; {HINT}")


def import_deep_ep(attr: str):
    """deep_ep and deep_ep.<attr>; Unavailable with the exact error and a hint otherwise."""
    try:
        import deep_ep
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot serve this run"
        raise Unavailable(f"import deep_ep failed: {type(e).__name__}: {e}; {HINT}") from e
    if not hasattr(deep_ep, attr):
        raise Unavailable(f"deep_ep {getattr(deep_ep, '__version__', '?')} has no deep_ep.{attr}; {HINT}")
    return deep_ep, getattr(deep_ep, attr)


def bypass_nvlink_check() -> str:
    """Shared-GPU ranks only: Buffer.__init__ asks NVML whether every pair of ranks' GPUs is
    NVLink-connected, which NVML cannot answer for a GPU and itself. Buffer calls the name it
    imported into its own module (deep_ep.buffer on hybrid-ep and v1.2.1, deep_ep.buffers.legacy on
    main), so that is the one replaced (Megatron's Buffer too)."""
    from deep_ep import Buffer
    sys.modules[Buffer.__module__].check_nvlink_connections = lambda *args, **kwargs: None
    return NVLINK_BYPASS


def new_buffer(Buffer, *args, **kwargs):
    """Buffer(...) with explicitly_destroy where this DeepEP has it (its destructor can hang
    during exception handling); a build without NVSHMEM cannot serve RDMA or low-latency mode."""
    if "explicitly_destroy" in inspect.signature(Buffer.__init__).parameters:
        kwargs["explicitly_destroy"] = True
    try:
        return Buffer(*args, **kwargs)
    except RuntimeError as e:
        if NO_NVSHMEM in str(e):
            raise Unavailable(f"this deep_ep was built without NVSHMEM ({NO_NVSHMEM}): no low-latency "
                              "or cross-node mode") from e
        raise


def destroy(buffer) -> None:
    if buffer is not None and getattr(buffer, "explicitly_destroy", False):
        buffer.destroy()


@dataclass
class Grouped:
    x_RH: torch.Tensor
    scales_RS: torch.Tensor | None
    row_map_NK: torch.Tensor       # int32: grouped row of received slot (n, k), -1 elsewhere
    weights_NK: torch.Tensor       # fp32 received top-k weights (0 where not local)
    probs_R: torch.Tensor
    tokens_per_expert: torch.Tensor


def group_by_local_expert(x_NH, local_idx_NK, weights_NK, num_local: int, scales_NS=None,
                          num_rows: int | None = None, impl: str = "auto") -> Grouped:
    """Received tokens (one row per token) -> rows grouped by local expert, stable by token.
    local_idx_NK holds local expert ids in [0, L) or -1; num_rows, when the backend already knows
    the count, spares the device->host wait."""
    w = torch.where(local_idx_NK >= 0, weights_NK.float(), 0.0)
    p = ops.permute(x_NH, local_idx_NK, num_local, scales_TS=scales_NS, impl=impl, num_out_rows=num_rows,
                    probs_TK=w)
    return Grouped(p.x_RH, p.scales_RS, p.row_map_TK, w, p.probs_R, p.tokens_per_expert)


def weighted_rows(y_RH, g: Grouped, impl: str = "auto") -> torch.Tensor:
    """Per received token: sum over its local experts of weight * expert output ([N, H], y's dtype).
    This is what DeepEP/HybridEP's unweighted combine must be given."""
    return ops.unpermute(y_RH[: g.x_RH.shape[0]], g.row_map_NK, g.weights_NK, impl=impl)


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
        if self.shared_gpu:
            self.bypassed.append(bypass_nvlink_check())
        self.buffer = self._make_buffer(Buffer, group, w)

    def _make_buffer(self, Buffer, group, w):
        R, hidden_bytes = self.world, w.hidden * 2
        # one Config per direction for every call (the api and cached views), the ones DeepEP would default to
        self.configs = (Buffer.get_dispatch_config(R), Buffer.get_combine_config(R))
        nvl = max(c.get_nvl_buffer_size_hint(hidden_bytes, R) for c in self.configs)
        rdma = max(c.get_rdma_buffer_size_hint(hidden_bytes, R) for c in self.configs) if R > 8 else 0
        return new_buffer(Buffer, group, nvl, rdma)

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
        out = self.buffer.combine(weighted_rows(y_RH, handle.grouped, self.impl), handle.native, config=self.configs[1])
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


def recv_room_bytes(w) -> int:
    """Receive room for every rank's tokens, EP x T x (payload + bf16 combine rows): an assumption for the memory
    estimate of the deduplicating backends (DeepEP normal, HybridEP), not their own size rule."""
    return w.ep * w.num_tokens * (w.bytes_per_token + 2 * w.hidden)
