"""`mcore-alltoall`, `mcore-deepep`, `mcore-hybridep`: Megatron-Core's own token dispatchers.

These time the exact code a Megatron training step runs (`MoEAlltoAllTokenDispatcher`, and
`MoEFlexTokenDispatcher` with its `_DeepepManager` / `_HybridEPManager`), next to the raw backends,
under the same byte rule and oracle. Each dispatcher is built standalone from a small
`TransformerConfig` and a hand-built `ProcessGroupCollection(ep=G, tp_ep=G, expt_tp=None)` (pure EP,
no `parallel_state`), and driven through its six stages exactly as `MoELayer.forward` calls them:

    dispatch: dispatch_preprocess(x, routing_map, probs) -> token_dispatch -> dispatch_postprocess
    combine:  combine_preprocess -> token_combine -> combine_postprocess   (the experts applied the probs)

Where the probs go: Megatron applies the routing probs inside the experts and its combine is an unweighted
top-k sum, which is moebench's contract too. So dispatch returns the permuted probs that `dispatch_postprocess`
hands out (`Dispatched.probs_R`), the correctness experts apply them (untimed, as experts), and combine is
Megatron's three combine stages alone.

The routing map and dense probs (what `TopKRouter` returns) are built from topk_idx/topk_w once
per routing and cached, so the timed dispatch holds only the dispatcher's own work. The
dispatchers keep per-call state on themselves (splits, permutation maps, the DeepEP/HybridEP
handle, which their combine clears); the handle carries a shallow snapshot of that state and
combine restores it, so a combine may be repeated or follow several dispatches (the harness does).
`tokens_per_expert` is returned as a host list: `SequentialMLP` calls `.tolist()` on it too.

Matched A/B with the raw backends: without --num-sms, mcore-deepep and mcore-hybridep are given the SM
count the raw backend uses by default (DeepEP's Buffer.num_sms, 20; HybridEP's Configurer default, 24
in one NVLink domain and 8 across) instead of Megatron-Core's own default (0.16.1: moe_deepep_num_sms
20, moe_hybridep_num_sms 16), and the knobs record it with its source. Megatron's permute fusion
(`moe_permute_fusion`, Transformer Engine's fused permute) is off unless the knob `moe_permute_fusion=1`
is given; the knobs record it, and the raw backends record their local permute (`local_permute_impl`).

Needs CUDA: the alltoall dispatcher creates a `torch.cuda.Stream`, and Megatron's all_to_all
allocates on `torch.cuda.current_device()`. Without CUDA, setup raises Unavailable (WAIVED).
The flex dispatchers need EP >= 2 (Megatron asserts TPxEP > 1) and DeepEP/HybridEP importable by
Megatron (`fused_a2a.HAVE_DEEP_EP` / `HAVE_HYBRIDEP`); DeepEP recovers each token's experts with
`topk(probs)` and the dropless alltoall path sizes its buffers as T*topk, so masked routing
(fewer than top-k experts per token) is refused.

`knob_values["mcore_cpu_emulation"]` (tests only) runs the dispatchers on CPU/gloo by replacing the
few torch.cuda calls they make with CPU stand-ins (`emulate_cuda_on_cpu`): a functional check of
this driver, never a measurement.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist

from ..core.megatron_map import BACKENDS, FLEX
from ..core.workload import WorkloadError
from ..env.toolkit import dist_version, installed
from .base import SWITCH, Backend, Dispatched, Knob, Unavailable, exchange_sms
from .deepep import DeepEPBackend
from .deepep_family import NUM_SMS, deepep_flex_setup, recv_room_bytes
from .hybridep import HybridEPBackend


# ---------------------------------------------------------------- CPU emulation (tests only)
class _FakeEvent:
    def synchronize(self):
        pass

    def wait(self, *a, **k):
        pass

    def record(self, *a, **k):
        pass

    def query(self):
        return True


class _FakeStream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _FakeEvent()

    def synchronize(self):
        pass


_EMULATING = False


def emulate_cuda_on_cpu() -> None:
    """Make Megatron-Core's dispatchers and GPT model run on CPU (tests only, in a rank process).

    Replaces torch.cuda.{current_device, Stream, current_stream, stream, Event} with CPU stand-ins
    and Megatron's CUDA RNG tracker fork with a no-op. Never call it in a process that uses a GPU."""
    global _EMULATING
    if _EMULATING:
        return
    torch._dynamo.config.disable = True    # dynamo would query the (fake) CUDA device: run Megatron's jit_fuser eagerly
    cur = _FakeStream()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.Stream = _FakeStream
    torch.cuda.current_stream = lambda *a, **k: cur
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.Event = lambda *a, **k: _FakeEvent()
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    from megatron.core.transformer.moe import token_dispatcher as td
    to_cpu = td.maybe_move_tensor_to_cpu

    def _to_cpu(t, as_numpy=False, record_stream=False):   # on GPU the splits arrive as numpy
        return t.numpy() if torch.is_tensor(t) and as_numpy else to_cpu(t, as_numpy, record_stream)
    td.maybe_move_tensor_to_cpu = _to_cpu
    _EMULATING = True


def mcore_version() -> str:
    """The imported megatron-core's version ('' when it cannot be read)."""
    try:
        from megatron.core import package_info
        return str(package_info.__version__)
    except Exception:  # noqa: BLE001 - version is informational
        return dist_version("megatron-core") or ""


def num_sms_config(config_cls, backend: str, num_sms: int | None) -> dict:
    """TransformerConfig kwargs for an SM count: moe_flex_dispatcher_num_sms on megatron-core >= 0.19,
    moe_deepep_num_sms / moe_hybridep_num_sms before."""
    if num_sms is None or backend not in FLEX:
        return {}
    names = {f.name for f in dataclasses.fields(config_cls)}
    if "moe_flex_dispatcher_num_sms" in names:
        return {"moe_flex_dispatcher_num_sms": int(num_sms)}
    return {f"moe_{backend}_num_sms": int(num_sms)}


def matched_num_sms(backend: str, world: int, gpus_per_node: int) -> int:
    """The SMs the raw `deepep` / `hybridep` backend uses when none is given: DeepEP's Buffer.num_sms, or
    HybridEP's default for the number of NVLink domains EP spans."""
    if backend == "deepep":
        from deep_ep import Buffer
        return int(getattr(Buffer, "num_sms", 20))
    from .hybridep import default_num_sms, ranks_per_domain
    return default_num_sms(-(-world // ranks_per_domain(world, gpus_per_node)))


def check_flex_importable(backend: str) -> None:
    """Unavailable unless Megatron's fused_a2a could import the DeepEP/HybridEP buffer it needs."""
    from megatron.core.transformer.moe import fused_a2a
    b = BACKENDS[backend]
    if b.have_flag and not getattr(fused_a2a, b.have_flag, False):
        raise Unavailable(b.missing_hint)


# ---------------------------------------------------------------- the backends
@dataclass
class _Handle:
    state: tuple                   # shallow snapshot of the dispatcher's (and comm manager's) __dict__


class _McoreBackend(Backend):
    dispatcher_type: ClassVar[str] = "alltoall"
    flex_backend: ClassVar[str | None] = None
    supports_fp8 = False
    no_cached_view = "Megatron's dispatcher recomputes its routing metadata on every call (no handle to reuse)"
    no_graph_view = ("Megatron's dispatchers sync the host on every call (tokens_per_expert.tolist() / .item(); DeepEP's "
                     "CPU wait for the receive counts): nothing to capture without drop-and-pad")
    KNOBS = {"mcore_cpu_emulation": SWITCH, "moe_permute_fusion": SWITCH}   # emulation: tests only

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if not installed("megatron.core"):
            return False, "megatron-core is not installed (pip install megatron-core)"
        if cls.flex_backend and not installed("deep_ep"):
            return False, f"deep_ep is not installed (Megatron's {cls.flex_backend} path needs DeepEP)"
        return True, ""

    @classmethod
    def version(cls) -> str:
        return dist_version("megatron-core") or ""

    @classmethod
    def cpu_problem(cls, knob_values):
        if knob_values.get("mcore_cpu_emulation"):
            return ""
        return ("megatron-core's token dispatchers need CUDA (MoEAlltoAllTokenDispatcher creates a "
                "torch.cuda.Stream); run with --device cuda")

    @classmethod
    def buffer_bytes(cls, w):
        return recv_room_bytes(w) if cls.flex_backend else 0

    def validate(self, w, world):
        super().validate(w, world)
        if self.flex_backend and world < 2:
            raise WorkloadError(f"backend {self.name} needs --ep >= 2 (Megatron's flex dispatcher asserts TPxEP > 1)")
        if w.route.masked:
            raise WorkloadError(f"backend {self.name} cannot take masked routing: Megatron's dropless dispatchers "
                                "assume exactly top-k experts per token (num_out_tokens = T*topk; DeepEP recovers "
                                "the experts with topk(probs))")

    def setup(self, group, w, device):
        super().setup(group, w, device)
        if self.knob_values.get("mcore_cpu_emulation"):
            emulate_cuda_on_cpu()
        elif device.type != "cuda" or not torch.cuda.is_available():
            raise Unavailable(self.cpu_problem({}))
        try:
            from megatron.core.process_groups_config import ProcessGroupCollection
            from megatron.core.transformer.moe import token_dispatcher as td
            from megatron.core.transformer.transformer_config import TransformerConfig
        except Exception as e:  # noqa: BLE001 - an install that cannot import is WAIVED, with why
            raise Unavailable(f"import megatron.core failed: {type(e).__name__}: {e}") from None
        if self.flex_backend:
            check_flex_importable(self.flex_backend)
            if self.flex_backend == "deepep":
                self.bypassed += deepep_flex_setup(dist.get_world_size(group), w.hidden, self.ranks_per_gpu)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        L = w.local_experts
        self.config = TransformerConfig(**self._config_kwargs(TransformerConfig, w, world))
        pg = ProcessGroupCollection(ep=group, tp_ep=group, expt_tp=None)
        cls = td.MoEFlexTokenDispatcher if self.flex_backend else td.MoEAlltoAllTokenDispatcher
        self.d = cls(L, list(range(rank * L, (rank + 1) * L)), config=self.config, pg_collection=pg)
        self._mgr = getattr(self.d, "_comm_manager", None)
        self._mcore_version = mcore_version()

    def _config_kwargs(self, config_cls, w, world) -> dict:
        kw = dict(num_layers=1, hidden_size=w.hidden, num_attention_heads=1, num_moe_experts=w.num_experts,
                  moe_router_topk=w.topk, expert_model_parallel_size=world,
                  moe_token_dispatcher_type=self.dispatcher_type,
                  moe_router_dtype="fp32", bf16=True, params_dtype=torch.bfloat16,
                  moe_router_pre_softmax=w.topk == 1)   # the router setting Megatron demands at top-1
        kw["moe_permute_fusion"] = self.permute_fusion
        if self.flex_backend:
            kw["moe_flex_dispatcher_backend"] = self.flex_backend
            sms = self.knob_values.get("num_sms")
            self.num_sms_source = "user" if sms is not None else "the raw backend's default (matched A/B)"
            self.num_sms = int(sms) if sms is not None else matched_num_sms(self.flex_backend, world, w.gpus_per_node)
            kw.update(num_sms_config(config_cls, self.flex_backend, self.num_sms))
        return kw

    @property
    def permute_fusion(self) -> bool:
        """Knob moe_permute_fusion (0/1, default off: Megatron's fused permute needs Transformer Engine)."""
        return bool(int(self.knob_values.get("moe_permute_fusion") or 0))

    def sms_used(self):
        return getattr(self, "num_sms", None) if self.flex_backend else exchange_sms(getattr(self, "group", None))

    def knobs(self):
        k = {n: v for n, v in super().knobs().items() if n != "ops_impl"}   # moebench.ops is not used here
        k.update(dispatcher_type=self.dispatcher_type, moe_permute_fusion=self.permute_fusion)
        if self.flex_backend:
            k["flex_backend"] = self.flex_backend
        d = getattr(self, "d", None)
        if d is not None:
            k["dispatcher_class"] = type(d).__name__
            if self._mgr is not None:
                k["comm_manager_class"] = type(self._mgr).__name__
            k["megatron_core"] = self._mcore_version
            for f in ("moe_flex_dispatcher_num_sms", "moe_deepep_num_sms", "moe_hybridep_num_sms"):
                if hasattr(self.config, f) and getattr(self.config, f) is not None and self.flex_backend:
                    k[f] = getattr(self.config, f)
            if self.flex_backend:
                k.update(num_sms=self.num_sms, num_sms_source=self.num_sms_source)
        return k

    def _snapshot(self) -> tuple:
        return dict(self.d.__dict__), (dict(self._mgr.__dict__) if self._mgr is not None else None)

    def _restore(self, state: tuple) -> None:
        self.d.__dict__.update(state[0])
        if self._mgr is not None and state[1] is not None:
            self._mgr.__dict__.update(state[1])

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        rmap, probs = self.dense_routing(topk_idx_TK, topk_w_TK)
        d = self.d
        h, p = d.dispatch_preprocess(x_TH, rmap, probs)
        h, p = d.token_dispatch(h, p)
        h, tpe, p = d.dispatch_postprocess(h, p)
        tpe = tpe.tolist() if isinstance(tpe, torch.Tensor) else [int(c) for c in tpe]
        return Dispatched(h, tpe, _Handle(self._snapshot()), None, p.reshape(-1))

    def combine(self, y_RH, handle: _Handle):
        self._restore(handle.state)
        d = self.d
        h = d.combine_preprocess(y_RH)
        h = d.token_combine(h)
        return d.combine_postprocess(h)


class McoreAlltoallBackend(_McoreBackend):
    """Megatron-Core MoEAlltoAllTokenDispatcher: one copy per (token, expert) on the wire."""
    name = "mcore-alltoall"
    dedup = False
    dispatcher_type = "alltoall"
    comm_kernels = ("nccl",)


class McoreDeepEPBackend(_McoreBackend):
    """Megatron-Core MoEFlexTokenDispatcher with _DeepepManager (DeepEP normal kernels)."""
    name = "mcore-deepep"
    dedup = True
    dispatcher_type = "flex"
    flex_backend = "deepep"
    comm_kernels = DeepEPBackend.comm_kernels
    KNOBS = {**_McoreBackend.KNOBS, "num_sms": NUM_SMS}        # Megatron hands it to Buffer.set_num_sms


class McoreHybridEPBackend(_McoreBackend):
    """Megatron-Core MoEFlexTokenDispatcher with _HybridEPManager (DeepEP hybrid-ep branch)."""
    name = "mcore-hybridep"
    dedup = True
    dispatcher_type = "flex"
    flex_backend = "hybridep"
    comm_kernels = HybridEPBackend.comm_kernels
    KNOBS = {**_McoreBackend.KNOBS, "num_sms": Knob(low=1)}


__all__ = ["McoreAlltoallBackend", "McoreDeepEPBackend", "McoreHybridEPBackend", "emulate_cuda_on_cpu",
           "num_sms_config", "mcore_version"]
