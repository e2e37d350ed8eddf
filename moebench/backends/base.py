"""Backend protocol and registry.

A backend moves tokens to the ranks that hold their experts (dispatch), each row with its routing prob, and
brings the expert outputs back as each token's sum (combine; the experts applied the probs, as Megatron's do). One module per backend; the registry maps Megatron's
names to "module:Class" strings so that heavy packages (deep_ep, megatron.core) are imported only
when that backend is asked for.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from ..cli import comma_list
from ..core.workload import Workload, WorkloadError
from ..ops import IMPLS

# name -> "module:Class"; names are Megatron's own values so flags are a lookup
REGISTRY: dict[str, str] = {
    "alltoall": "moebench.backends.alltoall:AlltoallBackend",
    "deepep": "moebench.backends.deepep:DeepEPBackend",
    "deepep-ll": "moebench.backends.deepep_ll:DeepEPLowLatencyBackend",
    "hybridep": "moebench.backends.hybridep:HybridEPBackend",
    "ncclep": "moebench.backends.ncclep:NcclEPBackend",
    "deepep-v2": "moebench.backends.deepep_v2:DeepEPV2Backend",
    "mcore-alltoall": "moebench.backends.mcore:McoreAlltoallBackend",
    "mcore-deepep": "moebench.backends.mcore:McoreDeepEPBackend",
    "mcore-hybridep": "moebench.backends.mcore:McoreHybridEPBackend",
}
PLUGIN_ENV = "MOEBENCH_BACKENDS"    # NAME=module:Class[,...]: backends of your own, without editing moebench


def _plugins(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, path = item.partition("=")
        if not (sep and name and ":" in path):
            raise WorkloadError(f"{PLUGIN_ENV}: {item!r} is not NAME=module:Class")
        out[name] = path
    return out


REGISTRY.update(_plugins(os.environ.get(PLUGIN_ENV, "")))


@dataclass
class Dispatched:
    """What dispatch hands to the local experts.

    x_RH: received rows grouped by local expert (expert 0's rows first), bf16 or fp8; with `slots`, the library's
        slot tensor [L, M, H] as it is (expert j's rows are x_RH[j, :tokens_per_expert[j]]).
    tokens_per_expert: rows per local expert (host list or a device tensor of length L).
    handle: whatever combine needs to send rows back; opaque to the harness.
    scales_RS: fp32 per-128 scales when x_RH is fp8 ([L, M, S] with `slots`).
    probs_R: routing weight of each received row as the library carried it (Megatron's experts apply it); None
        where the library weighs in its combine kernel instead (Backend.probs_in_combine).
    slots: x_RH is a low-latency slot layout (DeepEP's and NCCL EP's), which experts read as it is (a masked grouped
        GEMM over the per-expert counts); the oracle gathers the rows, outside any timed region.
    """
    x_RH: torch.Tensor
    tokens_per_expert: Any
    handle: Any = None
    scales_RS: torch.Tensor | None = None
    probs_R: torch.Tensor | None = None
    slots: bool = False


def routing_map_and_probs(topk_idx_TK: torch.Tensor, topk_w_TK: torch.Tensor, num_experts: int):
    """(routing_map bool [T, E], probs fp32 [T, E]), the dense form Megatron's TopKRouter returns;
    slots with idx -1 are dropped. Expert ids in a row are distinct (workload.py guarantees it)."""
    valid = topk_idx_TK >= 0
    safe = torch.where(valid, topk_idx_TK, 0).long()
    T = topk_idx_TK.shape[0]
    hits = torch.zeros(T, num_experts, dtype=torch.int32, device=topk_idx_TK.device)
    hits.scatter_add_(1, safe, valid.to(torch.int32))
    probs = torch.zeros(T, num_experts, dtype=torch.float32, device=topk_idx_TK.device)
    probs.scatter_add_(1, safe, torch.where(valid, topk_w_TK.float(), 0.0))
    return hits > 0, probs


ENV_KNOB = "env:"       # a knob env:VAR=V sets VAR for the rank processes instead of reaching a backend


@dataclass(frozen=True)
class Knob:
    """A knob a backend reads from its knob_values, and the values it takes; the command line checks
    `--knob`, `--num-sms`, `--ops-impl` and a sweep's knob axes against these before anything runs."""
    low: int | None = None          # an integer knob: its smallest value
    even: bool = False              # ... even values only
    choices: tuple = ()             # a knob of named values (or of 0 / 1)

    def problem(self, value) -> str:
        """'' when `value` is allowed, else what is allowed ("an even integer >= 2")."""
        if self.choices:
            return "" if value in self.choices else "one of " + ", ".join(map(str, self.choices))
        want = ("an even integer" if self.even else "an integer") + (f" >= {self.low}" if self.low is not None else "")
        if isinstance(value, bool) or not isinstance(value, int):
            return want
        if (self.low is not None and value < self.low) or (self.even and value % 2):
            return want
        return ""


NCCL_SMS = "nccl"    # sms_used() of the NCCL all-to-all paths: NCCL picks its channels (one CTA each) per call


def exchange_sms(group) -> str | None:
    """sms_used() of a path that exchanges through torch.distributed: NCCL's channels ("nccl"), the group's backend
    where it uses no SMs ("gloo": the host), None with one rank (no exchange runs)."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return None
    backend = torch.distributed.get_backend(group)
    return NCCL_SMS if backend == "nccl" else backend
OPS_IMPL = Knob(choices=("auto", *IMPLS))    # moebench's local permute / unpermute (auto: the fastest per op)
SWITCH = Knob(choices=(0, 1))


@dataclass
class GraphPlan:
    """A backend's graph-safe mode (timing view `graph`; `chained` queues the same pairs free-running): calls that
    make no host sync, so that each can be captured in a CUDA graph and replayed. `combine` is given the captured
    dispatch's output (low-latency mode combines what that dispatch received); `between`, when set, runs (captured,
    untimed) between the two: moebench's correctness expert on the received rows, where the combine needs it."""
    mode: str                                           # named in the record
    dispatch: Callable[[], Dispatched]
    combine: Callable[[Dispatched], torch.Tensor]
    between: Callable[[Dispatched], None] | None = None


class Unavailable(RuntimeError):
    """Raised by setup() when the package imports but cannot serve this run: the backend is WAIVED."""


@dataclass
class Backend:
    """Base class: subclasses set `name` and implement setup/dispatch/combine."""
    name: ClassVar[str] = ""
    dedup: ClassVar[bool] = True          # one copy per (token, destination rank) on the wire
    supports_fp8: ClassVar[bool] = False
    timed_phases: ClassVar[tuple[str, ...]] = ("dispatch", "combine")
    knob_values: dict = field(default_factory=dict)   # e.g. {"num_sms": 24} from the CLI
    ranks_per_gpu: int = 1        # set by the runner: > 1, ranks share GPUs (gloo group, CUDA IPC on one device)
    bypassed: list = field(default_factory=list)      # checks skipped for shared-GPU ranks, named in the record
    # Timing view `kernel`: substrings of the profiler names of this backend's communication kernels
    # (the local permute and weighting kernels are not among them); () = no kernel view.
    comm_kernels: ClassVar[tuple[str, ...]] = ()
    kernel_view: ClassVar[str] = ""          # "bench_kineto": the kernel view profiles as DeepEP's tests (views/kernel)
    cached_loop: ClassVar[str] = ""          # "ep_bench": the cached view times as NCCL EP's ep_bench (views/cached)
    no_cached_view: ClassVar[str] = "this backend has no call that reuses the dispatch handle"
    no_graph_view: ClassVar[str] = "this backend has no dispatch without a host sync (nothing to capture)"
    KNOBS: ClassVar[dict[str, Knob]] = {}             # the knob names this backend reads, and their values
    # Where the routing probs are applied. "" (every training path): dispatch hands them to the experts (probs_R), the
    # experts multiply them in, and combine is an unweighted sum (Megatron-Core 0.19, moe_layer.py
    # routed_experts_compute, experts.py bias_act_func). Else how the library weighs in its own combine kernel (the
    # low-latency modes, whose dispatch carries no probs): the experts then leave them out.
    probs_in_combine: ClassVar[str] = ""

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """(False, why) when a package is missing: the backend is WAIVED. Must be cheap and must
        not import the package (use importlib.util.find_spec): a crashing import is found in the
        rank processes, where it is contained; setup() raises Unavailable for incompatible ones."""
        return True, ""

    @classmethod
    def version(cls) -> str:
        return ""

    @classmethod
    def cpu_problem(cls, knob_values: dict) -> str:
        """Why this backend cannot run on a CPU/gloo run ('' when it can): checked before any rank starts."""
        return ""

    @classmethod
    def buffer_bytes(cls, w: Workload) -> int:
        """Device memory of the backend's own buffers per rank, for the pre-launch memory estimate
        (harness/preflight.py); 0 when it allocates only what it returns."""
        return 0

    def validate(self, w: Workload, world: int) -> None:
        """Raise WorkloadError for shapes, EP sizes or knob values this backend cannot take."""
        if w.dtype == "fp8" and not self.supports_fp8:
            raise WorkloadError(f"backend {self.name} cannot carry fp8 payloads (use --dtype bf16)")
        for k, rule in self.KNOBS.items():
            v = self.knob_values.get(k)
            if v is not None and rule.problem(v):
                raise WorkloadError(f"{self.name} knob {k} must be {rule.problem(v)}, got {v!r}")

    def setup(self, group, w: Workload, device: torch.device) -> None:
        """Allocate buffers, warm up JIT; untimed."""
        self.group, self.w, self.device = group, w, device

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None) -> Dispatched:
        raise NotImplementedError

    def combine(self, y_RH: torch.Tensor, handle) -> torch.Tensor:
        """Each token's expert outputs summed back to [T, H] bf16 (the experts applied the probs; unless
        probs_in_combine, no weight is applied here)."""
        raise NotImplementedError

    def expert_buffer(self, d: Dispatched) -> torch.Tensor | None:
        """Where the experts write their output so that combine reads it with no copy (Megatron's NCCL EP zero-copy,
        the low-latency slots): a tensor of d.x_RH's rows (or slots) in bf16, or None when the experts return a
        tensor of their own. Combine is then given this tensor."""
        return None

    def extra_phases(self, x_TH, topk_idx_TK, topk_w_TK) -> dict:
        """Other timed phases as {phase: zero-arg callable}, e.g. DeepEP's layout."""
        return {}

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d: Dispatched, y_RH) -> dict:
        """Timing view `cached`: {"dispatch": fn -> Dispatched, "combine": fn -> [T, H]}, the calls repeated
        with the routing handle / metadata of the checked dispatch `d` reused, as the upstream tests time
        them (DeepEP's test_intranode, HybridEP's test). Every view of a phase moves the same data: a cached
        call skips only host and metadata work (the count exchange, the host waits, the layout), never a
        copy the api call makes (the local grouping included). {} when the backend has no such call."""
        return {}

    def graph_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d: Dispatched, y_RH) -> GraphPlan | str:
        """Timing view `graph`: the backend's graph-safe calls, or why it has none (a host sync inside, a
        gloo group, data-dependent output sizes)."""
        return self.no_graph_view

    def chained_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d: Dispatched, y_RH) -> GraphPlan | str:
        """Timing view `chained`: a dispatch -> combine pair the host can queue back to back, free-running, with no
        host sync inside (CollectiveX's chain), or why there is none. By default the graph view's calls: a call that
        can be captured makes no host sync. A backend whose sync-free calls cannot be captured gives them here."""
        plan = self.graph_plan(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH)
        return f"no dispatch -> combine pair known free of host syncs: {plan}" if isinstance(plan, str) else plan

    def cached_graph(self, mode: str, cached: dict) -> GraphPlan:
        """A GraphPlan of the cached calls, where those are graph-safe (the checked handle reused)."""
        return GraphPlan(mode, cached["dispatch"], lambda d_graph: cached["combine"]())

    def barrier(self) -> None:
        """The ranks meet (the kernel view's bench_kineto mode): the backend's own barrier where it has one."""
        torch.distributed.barrier(self.group)

    def native_bytes(self, d: Dispatched) -> int | None:
        """This rank's received dispatch bytes as the upstream test counts them (DeepEP and HybridEP:
        recv_x.numel() * 2, fp8 x (1 + 4/128) / 2), from the real call's output; None when the backend
        has no upstream rule. The runner asserts it equals the rank's received (token, rank) pairs times
        native_rule's bytes per row."""
        return None

    def native_rule(self, w: Workload) -> tuple[int, str]:
        """(bytes per received (token, rank) row, the rule's name) that native_bytes counts: the payload, moebench's
        own rule, unless the upstream test counts more per row (core/traffic.py's upstream rules)."""
        return w.bytes_per_token, "moebench/1"

    def dense_routing(self, topk_idx_TK, topk_w_TK):
        """routing_map_and_probs(), cached while the same, unmodified routing tensors come again:
        Megatron's router hands dispatchers this dense form, so building it is not dispatch work."""
        src = getattr(self, "_route_src", None)
        key = (topk_idx_TK._version, topk_w_TK._version)
        if src is None or src[0] is not topk_idx_TK or src[1] is not topk_w_TK or src[2] != key:
            src = (topk_idx_TK, topk_w_TK, key,
                   *routing_map_and_probs(topk_idx_TK, topk_w_TK, self.w.num_experts))
            self._route_src = src
        return src[3], src[4]

    def sms_used(self) -> int | str | None:
        """The SMs the backend's communication kernels used (the table's SMs column): the count it resolved, or
        a word where the library decides per call (NCCL's channels); the knob where that is all that is known."""
        return self.knob_values.get("num_sms")

    def knobs(self) -> dict:
        """Settings that shaped the run (SMs, chunk sizes, env, implementation choices): the knobs this backend
        reads (a run's --knob goes to every backend) and env: ones; `num_sms_used` always."""
        mine = {k: v for k, v in self.knob_values.items() if k in self.KNOBS or k.startswith(ENV_KNOB)}
        return {**mine, "num_sms_used": self.sms_used()}

    def teardown(self) -> None:
        pass


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> type[Backend]:
    """The backend class for a registered name; a clear error listing known names otherwise."""
    if name not in REGISTRY:
        raise WorkloadError(f"unknown backend {name!r} (known: {', '.join(REGISTRY)})")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def parse_backends(spec: str) -> list[str]:
    """'all' or a comma-separated list; unknown, empty or repeated names raise WorkloadError."""
    if spec.strip() == "all":
        return list(REGISTRY)
    try:
        out = comma_list(spec, "--backend", "backend")
    except ValueError as e:
        raise WorkloadError(f"{e} (give all, or a list of: {', '.join(REGISTRY)})") from None
    if "all" in out:
        raise WorkloadError(f"--backend {spec!r}: all names every backend; give it alone, or list the backends")
    for n in out:
        if n not in REGISTRY:
            raise WorkloadError(f"unknown backend {n!r} (known: all, {', '.join(REGISTRY)})")
    return out


def knob_problem(knobs: dict, backends, flag: str = "--knob") -> str:
    """'' when every knob is env:VAR or read by at least one of `backends` that takes its value; else one
    line naming the flag, the knob and what those backends take (or the knob names they know)."""
    for k, v in knobs.items():
        if k.startswith(ENV_KNOB):
            if not k[len(ENV_KNOB):]:
                return f"{flag} {k}: env:VAR names no variable"
            continue
        rules = {b: get(b).KNOBS[k] for b in backends if k in get(b).KNOBS}
        if not rules:
            listed = "; ".join(f"{b}: {', '.join(get(b).KNOBS) or 'none'}" for b in backends)
            return (f"{flag} {k}: no backend of this run reads a knob {k!r} (known: {listed}; "
                    f"or {ENV_KNOB}VAR=V for the rank processes' environment)")
        if all(rule.problem(v) for rule in rules.values()):
            b, rule = next(iter(rules.items()))
            return f"{flag} {k}={v}: {b} takes {k} {rule.problem(v)}"
    return ""
