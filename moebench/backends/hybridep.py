"""`hybridep`: NVIDIA's HybridEP (`deep_ep.HybridEPBuffer`, DeepEP branch hybrid-ep).

HybridEP takes a bool routing_map [T, E] plus dense probs [T, E] (a -1 in topk_idx is not
supported, so moebench builds the map itself; masked slots are simply absent). Two paths, knob
`mode` (env MOEBENCH_HYBRIDEP_MODE when the CLI passes no knob):
- `permute` (default; what Megatron's flex dispatcher calls): dispatch_with_permute returns rows
  grouped by local expert with one prob per row, which the experts apply (as Megatron's do);
  combine_with_unpermute is an unweighted sum of the expert rows as they are.
- `plain`: dispatch returns each token once per rank plus the handle's local_expert_routing_map;
  moebench groups rows with ops.permute (each with its prob, for the experts) and sums each token's
  expert rows with its unweighted local unpermute before HybridEP's (unweighted) combine.
Kernels JIT-compile with $CUDA_HOME/bin/nvcc on first use of each config, so setup() checks nvcc
and warms up the exact config that will be timed. SM knobs: num_sms (dispatch and combine),
num_sms_dispatch, num_sms_combine, num_sms_preprocessing, num_blocks_permute, num_blocks_unpermute;
without them HybridEP's own default (24 SMs in one NVLink domain, 8 across: its Configurer), which
mcore-hybridep is given too, so that the two compare at one SM count. Each HybridEPBuffer compiles its kernels
afresh with nvcc (into $HYBRID_EP_CACHE_DIR or $HOME, under .deepep/hybrid_ep/jit) unless knob
`load_cached_kernels=1` (HybridEPBuffer's own option) loads the ones compiled there before: setup, never a timed
call, gets faster. Give such runs a folder of their own: the buffer opens the .so files it finds there, and another
process's compile writes its unfinished .so into the same folder. The NVLink domain HybridEP
uses is read from the buffer after construction and recorded in the knobs.

Timing view `cached`, as tests/test_hybrid_ep.py times it: the checked dispatch's handle reused, so
no metadata preprocessing and no host wait (permute: `num_permuted_tokens`, plain:
`num_dispatched_tokens`), and the combine as the api call.

Legend: T tokens, H hidden, E experts, K top-k, L local experts, N received tokens, R grouped rows.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..core.workload import WorkloadError, rank_inputs
from .base import OPS_IMPL, SWITCH, Backend, Dispatched, Knob, Unavailable
from ..env.deepep import build_version
from .deepep_family import (
    FP8_FACTOR,
    Grouped,
    cuda_home,
    find,
    group_by_local_expert,
    import_deep_ep,
    recv_room_bytes,
    unpermuted_rows,
)

DOMAIN_ENV = "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"
MODES = ("permute", "plain")
SM_KNOBS = {"num_sms_dispatch": "num_sms_dispatch_api", "num_sms_combine": "num_sms_combine_api",
            "num_sms_preprocessing": "num_sms_preprocessing_api", "num_blocks_permute": "num_blocks_permute",
            "num_blocks_unpermute": "num_blocks_unpermute"}
ENV_KNOBS = (DOMAIN_ENV, "USE_MNNVL", "NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API",
             "HYBRID_EP_CACHE_DIR", "CUDA_HOME")


def ranks_per_domain(world: int, gpus_per_node: int) -> int:
    """HybridEP's NVLink-domain size: the env override, else min(world, gpus per node)."""
    env = os.environ.get(DOMAIN_ENV)
    if env is not None:
        if not env.strip().isdigit() or int(env) < 1:
            raise WorkloadError(f"{DOMAIN_ENV}={env!r} is not a positive integer")
        return int(env)
    return min(world, gpus_per_node)


def default_num_sms(num_domains: int) -> int:
    """HybridEP's SMs per dispatch/combine API when none is given (csrc/hybrid_ep/config.cuh, Configurer)."""
    return 24 if num_domains == 1 else 8


def same_host_ranks(group) -> int:
    """Ranks of the group on this host: the NVLink domain HybridEP's detect_accessible_ranks finds over
    CUDA IPC (it may find more with multi-node NVLink fabric memory)."""
    hosts = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return hosts.count(socket.gethostname())


def local_plain_inputs(local_map_NL: torch.Tensor, probs_NX: torch.Tensor | None, rank_in_domain: int):
    """Plain dispatch -> (local expert ids [N, L] with -1, weights [N, L]). HybridEP's plain dispatch
    returns probs [N, L x ranks per NVLink domain]: each received row carries its source token's whole
    row for the experts of this NVLink domain (other domains' columns are dropped), and this rank's experts
    are columns [local_rank*L, (local_rank+1)*L), local_rank = HybridEPBuffer.local_rank (rank % domain
    size). Same offset HybridEP's own permute kernel reads (extension/permute.cu, prob_base)."""
    N, L = local_map_NL.shape
    ids = torch.arange(L, device=local_map_NL.device).expand(N, L)
    idx = torch.where(local_map_NL, ids, -1)
    if probs_NX is None:
        return idx, torch.zeros(N, L, dtype=torch.float32, device=local_map_NL.device)
    start = rank_in_domain * L if probs_NX.shape[1] > L else 0
    return idx, probs_NX[:N, start:start + L].float() * local_map_NL


def _flat(probs_R):
    """dispatch_with_permute's probs, one per permuted row."""
    return probs_R.reshape(-1) if probs_R is not None else None


@dataclass
class _Handle:
    native: object                          # HybridEP's handle; [3] is num_dispatched_tokens_tensor
    rows: int                               # rows HybridEP returned (permuted rows, or dispatched tokens)
    grouped: Grouped | None = None          # plain mode: the local grouping, and the ids and weights it used
    local: tuple | None = None


class HybridEPBackend(Backend):
    name = "hybridep"
    dedup = True
    supports_fp8 = True
    comm_kernels = ("dispatch_kernel", "combine_kernel")   # as its test's bench_kineto names them
    KNOBS = {"mode": Knob(choices=MODES), "num_sms": Knob(low=1), **{k: Knob(low=1) for k in SM_KNOBS},
             "ops_impl": OPS_IMPL, "load_cached_kernels": SWITCH}

    @classmethod
    def available(cls):
        ok, why = find("deep_ep")
        return (ok, why) if not ok else find("hybrid_ep_cpp")

    @classmethod
    def version(cls):
        return build_version()

    @classmethod
    def buffer_bytes(cls, w):
        return recv_room_bytes(w)

    @property
    def mode(self) -> str:
        return self.knob_values.get("mode") or os.environ.get("MOEBENCH_HYBRIDEP_MODE") or "permute"

    def validate(self, w, world):
        super().validate(w, world)
        if world < 2:
            raise WorkloadError("hybridep needs 2+ ranks (HybridEPBuffer segfaults at world size 1)")
        if w.hidden % 16:
            raise WorkloadError(f"hybridep needs --hidden divisible by 16, got {w.hidden}")
        if w.dtype == "fp8" and w.hidden % 512:
            raise WorkloadError(f"hybridep fp8 needs --hidden divisible by 512, got {w.hidden}")
        rpd = ranks_per_domain(world, w.gpus_per_node)
        if world % rpd:
            raise WorkloadError(f"hybridep: EP {world} is not a multiple of the NVLink domain size {rpd}")
        if (w.local_experts * rpd) % 4:
            raise WorkloadError(f"hybridep needs (experts per rank x ranks per NVLink domain) % 4 == 0, got "
                                f"{w.local_experts} x {rpd}")
        if self.mode not in MODES:
            raise WorkloadError(f"hybridep mode must be one of {MODES}, got {self.mode!r}")

    def setup(self, group, w, device):
        super().setup(group, w, device)
        self.cuda_home = cuda_home()
        _, HybridEPBuffer = import_deep_ep("HybridEPBuffer")
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.rpd_predicted = ranks_per_domain(self.world, same_host_ranks(group))
        self.build = self._build_kind()
        if self.build == "intranode" and self.world > self.rpd_predicted:
            raise Unavailable(f"this HybridEP build is intra-node-only and EP {self.world} spans "
                              f"{self.world // self.rpd_predicted} NVLink domains: it would abort; rebuild with "
                              "HYBRID_EP_MULTINODE=1")
        self.impl = self.knob_values.get("ops_impl", "auto")     # "auto": the fastest per op
        self.buffer = HybridEPBuffer(group=group, hidden_dim=w.hidden, max_num_of_tokens_per_rank=w.num_tokens,
                                     num_local_experts=w.local_experts, use_fp8=w.dtype == "fp8", **self._sm_kwargs(),
                                     **({"load_cached_kernels": True} if self.knob_values.get("load_cached_kernels")
                                        else {}))
        self.rpd = int(self.buffer.num_of_hybrid_ep_ranks_per_nvlink_domain)    # what HybridEP found
        x, idx, wt, q, s = rank_inputs(w, self.rank, device)
        d = self.dispatch(q if q is not None else x, idx, wt, s)          # JIT-compiles this config
        self.combine(d.x_RH.new_zeros(d.x_RH.shape, dtype=torch.bfloat16), d.handle)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _sm_kwargs(self) -> dict:
        kw = {}
        if self.knob_values.get("num_sms") is not None:
            kw["num_sms_dispatch_api"] = kw["num_sms_combine_api"] = int(self.knob_values["num_sms"])
        kw.update({api: int(self.knob_values[k]) for k, api in SM_KNOBS.items() if self.knob_values.get(k) is not None})
        return kw

    @staticmethod
    def _build_kind() -> str | None:
        from ..env import buildkind
        so = buildkind.extension_path("hybrid_ep_cpp")
        try:
            return buildkind.hybridep_build_kind(so).kind if so else None
        except (OSError, buildkind.ELFError):
            return None

    def sms_used(self):
        """The dispatch kernel's blocks (one per SM) of HybridEP's buffer config: its default when none was given."""
        cfg = getattr(getattr(getattr(self, "buffer", None), "configurer", None), "buffer_config", None)
        return cfg.num_of_blocks_dispatch_api if cfg is not None else self.knob_values.get("num_sms")

    def knobs(self):
        env = {k: os.environ[k] for k in ENV_KNOBS if k in os.environ}
        k = {**super().knobs(), "mode": self.mode, **self._sm_kwargs(), "build": getattr(self, "build", None), "env": env}
        cfg = getattr(getattr(getattr(self, "buffer", None), "configurer", None), "buffer_config", None)
        if cfg is not None:       # the SMs HybridEP uses (its default when none was given)
            k["num_sms"] = cfg.num_of_blocks_dispatch_api
            if cfg.num_of_blocks_combine_api != cfg.num_of_blocks_dispatch_api:
                k["num_sms_combine"] = cfg.num_of_blocks_combine_api
        if getattr(self, "rpd", None) is not None:
            k["ranks_per_nvlink_domain"] = self.rpd
            if self.rpd != self.rpd_predicted:
                k["ranks_per_nvlink_domain_predicted"] = self.rpd_predicted
        return k

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        rmap, probs = self.dense_routing(topk_idx_TK, topk_w_TK)
        fp8 = x_TH.dtype == torch.float8_e4m3fn
        hidden = x_TH.view(torch.uint8) if fp8 else x_TH
        if self.mode == "permute":
            tokens, probs_R, sf, tpe, h = self.buffer.dispatch_with_permute(
                hidden=hidden, routing_map=rmap, probs=probs, scaling_factor=scales_TS,
                num_of_experts_per_rank=self.w.local_experts, use_fp8=fp8)
            tokens = tokens.view(torch.float8_e4m3fn) if fp8 else tokens
            return Dispatched(tokens, tpe, _Handle(h, tokens.shape[0]), sf, _flat(probs_R))
        tokens, probs_NX, sf, h = self.buffer.dispatch(hidden=hidden, scaling_factor=scales_TS,
                                                       routing_map=rmap, probs=probs)
        N = tokens.shape[0]
        # h[4] = local_expert_routing_map [>= N, L], rows in dispatched order; HybridEP's own local rank
        idx, wts = local_plain_inputs(h[4][:N], probs_NX, getattr(self.buffer, "local_rank", self.rank % self.rpd))
        tokens = tokens.view(torch.float8_e4m3fn) if fp8 else tokens
        g = group_by_local_expert(tokens, idx, wts, self.w.local_experts, sf, impl=self.impl)
        return Dispatched(g.x_RH, g.tokens_per_expert, _Handle(h, N, grouped=g, local=(idx, wts)), g.scales_RS,
                          g.probs_R)

    def combine(self, y_RH, handle: _Handle):
        if self.mode == "permute":
            return self.buffer.combine_with_unpermute(hidden=y_RH, handle=handle.native)[0]
        return self.buffer.combine(hidden=unpermuted_rows(y_RH, handle.grouped, self.impl), probs=None,
                                   handle=handle.native)[0]

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """test_hybrid_ep's timed calls with the checked dispatch's handle and its row count given, so no metadata
        preprocessing and no host wait (permute mode: non_blocking, the metadata stays on the GPU); plain mode
        then groups the rows as the api call does. The combine needs no metadata: it is the api call."""
        h: _Handle = d.handle
        rmap, probs = self.dense_routing(topk_idx_TK, topk_w_TK)
        fp8 = x_TH.dtype == torch.float8_e4m3fn
        hidden = x_TH.view(torch.uint8) if fp8 else x_TH
        as_x = (lambda t: t.view(torch.float8_e4m3fn)) if fp8 else (lambda t: t)  # noqa: E731

        def permuted():
            tokens, probs_R, sf, _, _ = self.buffer.dispatch_with_permute(
                hidden=hidden, routing_map=rmap, probs=probs, scaling_factor=scales_TS, handle=h.native,
                num_permuted_tokens=h.rows, non_blocking=True)
            return Dispatched(as_x(tokens), d.tokens_per_expert, h, sf, _flat(probs_R))

        def plain():
            tokens, _, sf, _ = self.buffer.dispatch(hidden=hidden, scaling_factor=scales_TS, routing_map=rmap,
                                                    probs=probs, handle=h.native, num_dispatched_tokens=h.rows)
            g = group_by_local_expert(as_x(tokens), *h.local, self.w.local_experts, sf,
                                      num_rows=h.grouped.x_RH.shape[0], impl=self.impl)
            return Dispatched(g.x_RH, d.tokens_per_expert, h, g.scales_RS, g.probs_R)
        return {"dispatch": permuted if self.mode == "permute" else plain, "combine": lambda: self.combine(y_RH, h)}

    def graph_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        mode = ("handle reused, num_permuted_tokens given, non_blocking" if self.mode == "permute" else
                "handle reused, num_dispatched_tokens given")
        return self.cached_graph(mode, self.cached_phases(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH))

    def native_bytes(self, d):
        """test_hybrid_ep's nvl_dispatch = dispatched_hidden.numel() * 2 (plain dispatch: one row per received
        token), fp8 x (1 + 4/128) / 2, from the handle's num_dispatched_tokens (permute mode returns rows per expert)."""
        n = int(d.handle.native[3].reshape(-1)[0])
        return round(n * self.w.hidden * 2 * (FP8_FACTOR if self.w.dtype == "fp8" else 1))

    def teardown(self):
        self.buffer = None
