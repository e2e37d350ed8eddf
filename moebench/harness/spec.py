"""What one dispatch run is: the workload, the backends, and the options of the harness.

A `RunSpec` is built once, from the command line (`from_args`) or from a sweep's case
(`dataclasses.replace` of the sweep's base spec), checked once (`check`), and handed to the runner.
`to_argv()` is the single-case command line that rebuilds the same spec (the repro command of every
record, and the command checks/ep.py runs in its child); parsing it gives back an equal spec.

Knobs: `ops_impl`, `num_sms` and any `--knob KEY=VALUE` go to every backend; a knob `env:VAR`
sets VAR in the environment of the rank processes instead (HybridEP's chunk sizes).
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from ..backends import base
from ..backends.base import ENV_KNOB
from ..cli import Parser, count, number, seed
from ..core.workload import DTYPES, Workload, WorkloadError
from . import overlap, preflight
from .launch import pick_device
from .views import GRAPH_CALLS, VIEWS

CPU_DEFAULT_SHAPE = {"num_tokens": 256, "hidden": 1024}   # keeps --ep 8 under a minute on 2 cores
DEFAULT_ITERS = {"cuda": 20, "cpu": 5}
DEFAULT_WARMUP_MS = {"cuda": 200.0, "cpu": 0.0}
W0 = Workload()                                          # the workload defaults: defined once, in Workload


def add_shape_args(p: argparse.ArgumentParser, cpu_shape: bool = False, tokens_help: str = "tokens per rank") -> None:
    """--num-tokens, --hidden, --num-experts, --topk: one name, one meaning and one default (Workload's) in
    every tool. cpu_shape: --num-tokens and --hidden default to None, resolved by the device (dispatch)."""
    cpu = CPU_DEFAULT_SHAPE
    if cpu_shape:
        p.add_argument("--num-tokens", type=count(), help=f"{tokens_help} (default {W0.num_tokens}; CPU {cpu['num_tokens']})")
        p.add_argument("--hidden", type=count(), help=f"hidden size (default {W0.hidden}; CPU {cpu['hidden']})")
    else:
        p.add_argument("--num-tokens", type=count(), default=W0.num_tokens, help=f"{tokens_help} (default {W0.num_tokens})")
        p.add_argument("--hidden", type=count(), default=W0.hidden, help=f"hidden size (default {W0.hidden})")
    p.add_argument("--num-experts", type=count(), default=W0.num_experts, help=f"experts (default {W0.num_experts})")
    p.add_argument("--topk", type=count(), default=W0.topk, help=f"experts per token (default {W0.topk})")


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags of one dispatch run (moebench.dispatch adds the sweep flags to these)."""
    add_shape_args(p, cpu_shape=True)
    p.add_argument("--ep", type=count(), default=W0.ep, help="expert-parallel ranks")
    p.add_argument("--gpus-per-node", type=count(), default=W0.gpus_per_node, help="ranks per NVLink node (byte-rule split)")
    p.add_argument("--dtype", choices=DTYPES, default=W0.dtype, help="dispatch payload (combine is bf16)")
    p.add_argument("--routing", default=W0.routing,
                   help="uniform | balanced | zipf:S | group:G:M | trace:FILE, optionally ,masked:P")
    p.add_argument("--seed", type=seed, default=W0.seed)
    p.add_argument("--backend", default="all", help=f"all or a list of: {', '.join(base.names())}")
    p.add_argument("--iters", type=count(),
                   help=f"timed iterations (default {DEFAULT_ITERS['cuda']}; CPU {DEFAULT_ITERS['cpu']})")
    p.add_argument("--warmup-ms", type=number(0), help=f"warm-up budget per phase (default {DEFAULT_WARMUP_MS['cuda']:g}; "
                                                   f"CPU {DEFAULT_WARMUP_MS['cpu']:g})")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--ranks-per-gpu", type=count(), default=1, metavar="N",
                   help="shared-GPU ranks: N EP ranks per GPU (gloo group, CUDA IPC on one device), to run real "
                        "backends on fewer GPUs than EP ranks; functional only, never performance figures")
    p.add_argument("--out", default="moebench-dispatch.jsonl", help="JSONL file to append to (default: ./moebench-dispatch.jsonl)")
    p.add_argument("--ceiling-gbps", type=number(0, strict=True), help="override the nominal per-GPU link ceiling")
    p.add_argument("--num-sms", type=count(), help="SMs for deepep/hybridep kernels")
    p.add_argument("--ops-impl", default="auto", choices=base.OPS_IMPL.choices,
                   help="permute/unpermute implementation of the alltoall path")
    p.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE",
                   help="backend knob, repeatable (e.g. mode=plain, num_sms_dispatch=16; env:VAR=V sets "
                        "VAR for the rank processes)")
    p.add_argument("--no-flush-l2", action="store_true", help="skip the L2 flush before timed calls")
    p.add_argument("--profile", action="store_true",
                   help="CPU: also record each phase's top torch ops per call (on CUDA each phase's kernels are always "
                        "recorded: the kernel view and the host split)")
    p.add_argument("--timeout", type=number(0, strict=True), default=600.0, help="seconds per backend launch")
    p.add_argument("--views", default=",".join(VIEWS), type=parse_views, metavar="LIST",
                   help=f"timing views to time, a comma list of {', '.join(VIEWS)} (api always; default all; graph "
                        "capture costs a capture and a replay check per backend)")
    p.add_argument("--graph-calls", type=count(), default=GRAPH_CALLS, metavar="N",
                   help=f"graph view: dispatch + combine pairs captured back to back in one CUDA graph "
                        f"(default {GRAPH_CALLS}; 1, 4 and 16 timed alike on an H200; more pairs, more graph memory)")
    p.add_argument("--overlap", metavar="gemm[:MxNxK]",
                   help="also time each phase under a concurrent bf16 GEMM (default shape: received rows x hidden "
                        "x hidden) and record exposed time and GEMM slowdown (moebench/harness/overlap.py)")


def parse_views(text: str) -> tuple[str, ...]:
    """argparse type of --views: known names, api always kept, in VIEWS order."""
    names = {v.strip() for v in text.split(",") if v.strip()}
    unknown = sorted(names - set(VIEWS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown view {unknown[0]!r} (known: {', '.join(VIEWS)})")
    return tuple(v for v in VIEWS if v in names | {"api"})


def parse_knob(kv: str) -> tuple[str, int | str]:
    key, sep, val = kv.partition("=")
    if not sep or not key:
        raise WorkloadError(f"--knob wants KEY=VALUE, got {kv!r}")
    return key, int(val) if val.lstrip("-").isdigit() else val


@dataclass
class RunSpec:
    """One dispatch run: the workload, the backends and how the harness checks and times them.
    Every run setting is a field here, defined once; the runner and the rank processes take the spec."""
    workload: Workload
    backends: tuple[str, ...]
    explicit: bool = False           # backends were named (not `all`): one that cannot take the run is bad input
    device: str = "cpu"              # resolved: cpu | cuda
    iters: int = 5
    warmup_ms: float = 0.0
    flush_l2: bool = True
    timeout_s: float = 600.0
    knobs: dict = field(default_factory=dict)    # ops_impl, num_sms, --knob (env:VAR included)
    ceiling_gbps: float | None = None
    profile: bool = False
    ranks_per_gpu: int = 1
    overlap: str | None = None
    out: str = "moebench-dispatch.jsonl"
    measure_ceiling: bool = True     # also time a plain all_to_all_single for frac_of_measured (NCCL runs)
    views: tuple[str, ...] = VIEWS   # the timing views to time (harness/views.py); api always
    graph_calls: int = GRAPH_CALLS   # graph view: pairs captured in one graph
    note: str = field(default="", compare=False)  # what device picking wants said (CPU fallback)

    @property
    def functional(self) -> bool:
        """True when the times are not performance figures (CPU/gloo, or ranks sharing a GPU)."""
        return self.device == "cpu" or self.ranks_per_gpu > 1

    @property
    def backend_knobs(self) -> dict:
        """The knobs every backend is given (ops_impl, num_sms, --knob), env:VAR ones left out."""
        return {k: v for k, v in self.knobs.items() if not k.startswith(ENV_KNOB)}

    @property
    def env(self) -> dict:
        """Environment variables for the rank processes, from the env:VAR knobs."""
        return {k[len(ENV_KNOB):]: str(v) for k, v in self.knobs.items() if k.startswith(ENV_KNOB)}

    @classmethod
    def from_args(cls, args, workload: Workload | None = None) -> RunSpec:
        """From parsed dispatch flags; `workload` replaces the flags' shape (sweeps). Bad input
        raises WorkloadError."""
        overlap.parse(args.overlap)
        rpg = args.ranks_per_gpu
        device, note = pick_device(args.device, args.ep, rpg)
        extra = dict(parse_knob(kv) for kv in args.knob)
        knobs = {"ops_impl": args.ops_impl, **({"num_sms": args.num_sms} if args.num_sms is not None else {}), **extra}
        backends = tuple(base.parse_backends(args.backend))
        bad = base.knob_problem(extra, backends) or base.knob_problem(
            {k: knobs[k] for k in ("num_sms",) if k in knobs}, backends, "--num-sms")
        if bad:
            raise WorkloadError(bad)
        return cls(workload=workload or _workload(args, device == "cpu"), backends=backends,
                   explicit=args.backend != "all", device=device,
                   iters=args.iters if args.iters is not None else DEFAULT_ITERS[device],
                   warmup_ms=args.warmup_ms if args.warmup_ms is not None else DEFAULT_WARMUP_MS[device],
                   flush_l2=not args.no_flush_l2, timeout_s=args.timeout, knobs=knobs,
                   ceiling_gbps=args.ceiling_gbps, profile=args.profile, ranks_per_gpu=rpg, out=args.out,
                   overlap=args.overlap, views=args.views, graph_calls=args.graph_calls, note=note)

    @classmethod
    def from_argv(cls, argv: list[str]) -> RunSpec:
        p = Parser(prog="moebench.harness.spec")
        add_args(p)
        return cls.from_args(p.parse_args(argv))

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def check(self) -> RunSpec:
        """Bad input raises WorkloadError: an explicitly named backend that cannot take this run, or
        that would not fit in this machine's memory (preflight.py's estimate)."""
        if self.explicit:
            for n in self.backends:
                base.get(n)(knob_values=self.backend_knobs).validate(self.workload, self.workload.ep)
                too_big = preflight.refusal(n, self)
                if too_big:
                    raise WorkloadError(too_big)
        return self

    def to_argv(self) -> list[str]:
        """The `python -m moebench.dispatch` arguments that rebuild this spec."""
        w = self.workload
        argv = ["--num-tokens", w.num_tokens, "--hidden", w.hidden, "--num-experts", w.num_experts,
                "--topk", w.topk, "--ep", w.ep, "--gpus-per-node", w.gpus_per_node, "--dtype", w.dtype,
                "--routing", w.routing, "--seed", w.seed,
                "--backend", ",".join(self.backends) if self.explicit else "all", "--device", self.device,
                "--iters", self.iters, "--warmup-ms", self.warmup_ms, "--timeout", self.timeout_s, "--out", self.out]
        knobs = dict(self.knobs)
        argv += ["--ops-impl", knobs.pop("ops_impl", "auto")]
        if "num_sms" in knobs:
            argv += ["--num-sms", knobs.pop("num_sms")]
        for k, v in knobs.items():
            argv += ["--knob", f"{k}={v}"]
        if self.ceiling_gbps is not None:
            argv += ["--ceiling-gbps", self.ceiling_gbps]
        argv += ["--no-flush-l2"] * (not self.flush_l2) + ["--profile"] * self.profile
        if self.ranks_per_gpu != 1:
            argv += ["--ranks-per-gpu", self.ranks_per_gpu]
        if self.overlap:
            argv += ["--overlap", self.overlap]
        if self.views != VIEWS:
            argv += ["--views", ",".join(self.views)]
        if self.graph_calls != GRAPH_CALLS:
            argv += ["--graph-calls", self.graph_calls]
        return [str(a) for a in argv]


def _workload(args, cpu: bool) -> Workload:
    shape = {k: getattr(args, k) for k in CPU_DEFAULT_SHAPE}
    for k, v in shape.items():
        if v is None:
            shape[k] = CPU_DEFAULT_SHAPE[k] if cpu else getattr(W0, k)
    return Workload(num_experts=args.num_experts, topk=args.topk, ep=args.ep, dtype=args.dtype,
                    routing=args.routing, seed=args.seed, gpus_per_node=args.gpus_per_node, **shape)
