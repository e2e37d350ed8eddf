"""ncclEpDispatch and ncclEpCombine (ext `nccl_ep.cc:3250-3318`, `:4270-4326`): the structs read and checked, the
recipe validated (recipes.py), then the algorithm's own path (ht.py, ll.py). Forward passes only (the backward
pass is InvalidUsage in LL, as the library says; in HT it is not simulated)."""
from __future__ import annotations

from dataclasses import dataclass

from nccl._extensions.bindings import nccl_ep as bindings

from . import failures as f
from .failures import COMBINE
from . import ht, ll, recipes
from .handle import handle_of
from .memory import Desc, desc, struct
from .registry import native

FWD_PASS = 0


@dataclass
class Call:
    """One dispatch's or combine's descriptors (None: NULL) and config."""
    x: Desc                         # inputs.tokens
    w: Desc | None                  # inputs.topk_weights
    s: Desc | None                  # inputs.scales
    rx: Desc | None                 # outputs.tokens
    rw: Desc | None                 # outputs.topk_weights
    rs: Desc | None = None          # dispatch: outputs.scales
    ridx: Desc | None = None        # dispatch: outputs.topk_idx
    counters: Desc | None = None    # dispatch: layout_info.expert_counters
    ranks: Desc | None = None       # dispatch: layout_info.src_rank_counters
    recipe: int = 0
    backward: bool = False
    round_scales: int = 0


def _descs(s, names):
    return [desc(getattr(s, n)) for n in names]


@native
def dispatch(handle_ptr, inputs_ptr, outputs_ptr, layout_info_ptr, config_ptr, stream):
    h = handle_of(handle_ptr)
    ins = struct(bindings.DispatchInputs, inputs_ptr, "inputs")
    outs = struct(bindings.DispatchOutputs, outputs_ptr, "outputs")
    info = struct(bindings.LayoutInfo, layout_info_ptr, "layout_info", optional=True)
    cfg = struct(bindings.DispatchConfig, config_ptr, "config", optional=True)
    x = desc(ins.tokens, required=True)
    if x.ndim != 2:
        f.invalid(f.INVALID_ARGUMENT)                                              # :3291
    counters, ranks = _descs(info, ("expert_counters", "src_rank_counters")) if info is not None else (None, None)
    outputs = _descs(outs, ("tokens", "topk_weights", "scales", "topk_idx"))
    c = Call(x, *_descs(ins, ("topk_weights", "scales")), *outputs,
             counters=counters, ranks=ranks, recipe=int(cfg.quant_recipe) if cfg else 0,
             backward=bool(cfg and cfg.pass_direction != FWD_PASS), round_scales=int(cfg.round_scales) if cfg else 0)
    recipes.dispatch(c, h.group)
    _simulated(h, c, cfg, "ncclEpDispatch")
    (ht if h.group.ht else ll).dispatch(h, c)


@native
def combine(handle_ptr, inputs_ptr, outputs_ptr, config_ptr, stream):
    h = handle_of(handle_ptr)
    ins = struct(bindings.CombineInputs, inputs_ptr, "inputs")
    outs = struct(bindings.CombineOutputs, outputs_ptr, "outputs")
    cfg = struct(bindings.CombineConfig, config_ptr, "config", optional=True)
    c = Call(desc(ins.tokens, required=True, func=COMBINE), *_descs(ins, ("topk_weights", "scales")),
             desc(outs.tokens, required=True, func=COMBINE), desc(outs.topk_weights),
             recipe=int(cfg.quant_recipe) if cfg else 0, backward=bool(cfg and cfg.pass_direction != FWD_PASS))
    recipes.combine(c)
    _simulated(h, c, cfg, "ncclEpCombine")
    (ht if h.group.ht else ll).combine(h, c)


def _simulated(h, c: Call, cfg, api: str) -> None:
    """The LL backward pass is the library's InvalidUsage (`:3302-3306`, `:4300-4304`); the rest is the fake's."""
    if c.backward and not h.group.ht:
        f.invalid(f.INVALID_USAGE, f"{api}: backward pass (pass_direction=1) is not supported in LL mode")
    f.unsupported(not c.backward, "backward passes are not simulated")
    f.unsupported(not (cfg and cfg.send_only), "send_only staging is not simulated")
