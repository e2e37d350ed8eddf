"""What one dispatch run is: the workload, the backends, and the options of the harness.

Every setting is declared once, as a field: a Workload field carries its flag (core/workload.py), a
RunSpec field is `cli.setting(...)`, whose metadata makes the argparse flag, reads the parsed flags into
the field and writes the field back into a command line. So a new flag is one field (and the code that
reads it). A `RunSpec` is built from the command line (`from_args`) or from a sweep's case (`replace`),
checked once (`check`), and handed to the runner; `to_argv()` is the single-case command line that
rebuilds it (the repro command of every record, and the command checks/ep.py runs in its child).

Knobs: `--ops-impl`, `--num-sms` and any `--knob KEY=VALUE` go to every backend; a knob `env:VAR` sets VAR
in the environment of the rank processes instead (HybridEP's chunk sizes).
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from ..backends import base
from ..backends.base import ENV_KNOB
from ..cli import (MAX_CALLS, MAX_ITERS, MAX_WAIT_S, Parser, add_settings, comma_list, count, number,
                   read_settings, seconds, seed, setting, write_settings)
from ..core.workload import DTYPES, Workload, WorkloadError
from ..env.limits import open_files_problem
from ..records.shapes import TAIL_ITERS
from . import fault, overlap, preflight
from .launch import joined_env
from .placement import Placement, place
from .views import REGISTRY, VIEWS

CPU_DEFAULT_SHAPE = {"num_tokens": 256, "hidden": 1024}   # keeps --ep 8 under a minute on 2 cores
DEFAULT_ITERS = {"cuda": 20, "cpu": 5}
DEFAULT_WARMUP_MS = {"cuda": 200.0, "cpu": 0.0}
W0 = Workload()                                          # the workload defaults: defined once, in Workload
GRAPH_CALLS = REGISTRY["graph"].GRAPH_CALLS             # the graph view's default pairs per graph
KINDS = {"count": count(), "seed": seed, "str": str}
MAX_REPEATS = 1000


def add_workload_args(p: argparse.ArgumentParser, names: tuple[str, ...] | None = None, cpu_shape: bool = False,
                      helps: dict | None = None) -> None:
    """The Workload fields' flags (`names`: a subset), one name, one meaning and one default (Workload's) in
    every tool. cpu_shape: --num-tokens and --hidden default to None, resolved by the device (dispatch)."""
    for f in dataclasses.fields(Workload):
        m = f.metadata
        if names is not None and f.name not in names:
            continue
        what = (helps or {}).get(f.name, m["help"])
        kw = {"choices": DTYPES} if m["kind"] == "dtype" else {"type": KINDS[m["kind"]]}
        if cpu_shape and f.name in CPU_DEFAULT_SHAPE:
            p.add_argument(m["flag"], default=None, help=f"{what} (default {f.default}; CPU {CPU_DEFAULT_SHAPE[f.name]})",
                           **kw)
        else:
            p.add_argument(m["flag"], default=f.default, help=f"{what} (default {f.default})", **kw)


SHAPE = ("num_tokens", "hidden", "num_experts", "topk")


def add_shape_args(p: argparse.ArgumentParser, tokens_help: str = "tokens per rank") -> None:
    """--num-tokens, --hidden, --num-experts, --topk (check, plan)."""
    add_workload_args(p, SHAPE, helps={"num_tokens": tokens_help})


def parse_views(text: str) -> tuple[str, ...]:
    """argparse type of --views: known names, api always kept, in VIEWS order."""
    try:
        names = set(comma_list(text, "", "view"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (give a comma list of {', '.join(VIEWS)})") from None
    unknown = sorted(names - set(VIEWS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown view {unknown[0]!r} (known: {', '.join(VIEWS)})")
    return tuple(v for v in VIEWS if v in names | {"api"})


def parse_knob(kv: str) -> tuple[str, int | str]:
    key, sep, val = kv.partition("=")
    if not sep or not key:
        raise WorkloadError(f"--knob wants KEY=VALUE, got {kv!r}")
    return key, int(val) if val.lstrip("-").isdigit() else val


# ---- how the fields that are not one flag's value are read from the flags and written back ----------
def _read_backends(args, ctx):
    return tuple(base.parse_backends(args.backend))


def _write_knobs(knobs: dict) -> list:
    k = dict(knobs)
    argv = ["--ops-impl", k.pop("ops_impl", "auto")]
    if "num_sms" in k:
        argv += ["--num-sms", k.pop("num_sms")]
    return argv + [t for kv in k.items() for t in ("--knob", f"{kv[0]}={kv[1]}")]


def _read_knobs(args, ctx) -> dict:
    extra = dict(parse_knob(kv) for kv in args.knob)
    knobs = {"ops_impl": args.ops_impl, **({"num_sms": args.num_sms} if args.num_sms is not None else {}), **extra}
    backends = ctx["backends"]
    bad = base.knob_problem(extra, backends) or base.knob_problem(
        {k: knobs[k] for k in ("num_sms",) if k in knobs}, backends, "--num-sms")
    if bad:
        raise WorkloadError(bad)
    return knobs


@dataclass
class RunSpec:
    """One dispatch run: the workload, the backends and how the harness checks and times them."""
    workload: Workload
    backends: tuple[str, ...] = setting(("alltoall",), "--backend", help=f"all or a list of: {', '.join(base.names())}",
                                        default="all", read=_read_backends,
                                        write=lambda v: [])          # written with `explicit`
    explicit: bool = setting(False, read=lambda a, c: a.backend != "all")   # named (not `all`): a backend that
    #                                                     cannot take the run is then bad input, not WAIVED
    device: str = setting("cpu", "--device", help="where the ranks run (auto: GPUs when enough are visible)",
                          choices=("auto", "cuda", "cpu"), default="auto", read=lambda a, c: c["placement"].device,
                          write=lambda v: ["--device", v])
    iters: int = setting(5, "--iters", type=count(high=MAX_ITERS, why="every sample lands in the record"), default=None,
                         help=f"timed iterations (default {DEFAULT_ITERS['cuda']}; CPU {DEFAULT_ITERS['cpu']}; "
                              f"--tails: at least {TAIL_ITERS})", read=lambda a, c: _iters(a, c["placement"].device),
                         write=lambda v: ["--iters", v])
    tails: bool = setting(False, "--tails", action="store_true",
                          help=f"tails and the straggler: time at least {TAIL_ITERS} iterations (CollectiveX's samples "
                               "per cell), so the api, cached and graph views keep p99 and p999 (each needs 100 and "
                               "1000 samples; fewer: '-' and why); every record names its slowest rank either way")
    warmup_ms: float = setting(0.0, "--warmup-ms", type=number(0, high=MAX_WAIT_S * 1e3), default=None,
                               help=f"warm-up budget per phase (default {DEFAULT_WARMUP_MS['cuda']:g}; CPU "
                                    f"{DEFAULT_WARMUP_MS['cpu']:g})",
                               read=lambda a, c: (a.warmup_ms if a.warmup_ms is not None
                                                  else DEFAULT_WARMUP_MS[c["placement"].device]),
                               write=lambda v: ["--warmup-ms", v])
    flush_l2: bool = setting(True, "--no-flush-l2", help="skip the L2 flush before timed calls", action="store_true",
                             read=lambda a, c: not a.no_flush_l2, write=lambda v: [] if v else ["--no-flush-l2"])
    timeout_s: float = setting(600.0, "--timeout", type=seconds, default=600.0,
                               help="seconds per backend launch", read=lambda a, c: a.timeout,
                               write=lambda v: ["--timeout", v])
    pg_timeout_s: float | None = setting(None, "--pg-timeout", type=seconds, metavar="S",
                                         help="the process group's own timeout (gloo's wait, NCCL's watchdog; default "
                                              "--timeout; with --inject half of --watchdog, so that it can fire "
                                              "first, from the timed calls on)")
    inject: str | None = setting(None, "--inject", type=fault.parse_inject, metavar="kill:RANK@CALL|stall:RANK@CALL:S",
                                 help="fault acceptance: rank RANK is killed (SIGKILL) or stalls S seconds at its "
                                      "CALL-th timed dispatch call; the record says what the other ranks saw and how "
                                      "soon (the stack's own error, moebench's watchdog, a hang); the case FAILs "
                                      "(harness/fault.py)")
    watchdog_s: float | None = setting(None, "--watchdog", type=seconds, metavar="S",
                                       help="with --inject: moebench's watchdog, the seconds the other ranks have "
                                            "after the fault to end on their own before moebench ends them (default "
                                            "--timeout)")
    recreate: bool = setting(False, "--recreate", action="store_true",
                             help="after the timed calls, destroy the backend and build it again, timed (the churn "
                                  "sglang#24443 paid), then one call on it checked: the record's setup")
    knobs: dict = setting({}, "--ops-impl", default="auto", choices=base.OPS_IMPL.choices,
                          help="permute/unpermute implementation of the alltoall path", read=_read_knobs,
                          write=_write_knobs,
                          extra=(("--num-sms", {"type": count(), "help": "SMs for deepep/hybridep kernels"}),
                                 ("--knob", {"action": "append", "default": [], "metavar": "KEY=VALUE",
                                             "help": "backend knob, repeatable (e.g. mode=plain, num_sms_dispatch=16; "
                                                     "env:VAR=V sets VAR for the rank processes)"})))
    ceiling_gbps: float | None = setting(None, "--ceiling-gbps", type=number(0, strict=True),
                                         help="override the nominal per-GPU link ceiling")
    profile: bool = setting(False, "--profile", action="store_true",
                            help="CPU: also record each phase's top torch ops per call (on CUDA each phase's kernels "
                                 "are always recorded: the kernel view and the host split)")
    ranks_per_gpu: int = setting(1, "--ranks-per-gpu", type=count(), default=1, metavar="N",
                                 help="shared-GPU ranks: N EP ranks per GPU (gloo group, CUDA IPC on one device), to "
                                      "run real backends on fewer GPUs than EP ranks; functional only")
    overlap: str | None = setting(None, "--overlap", metavar="gemm[:MxNxK]",
                                  help="also time each phase under a concurrent bf16 GEMM (default shape: received "
                                       "rows x hidden x hidden): exposed time and GEMM slowdown (harness/overlap.py)")
    out: str = setting("moebench-dispatch.jsonl", "--out", default="moebench-dispatch.jsonl",
                       help="JSONL file to append to (default: ./moebench-dispatch.jsonl)",
                       write=lambda v: ["--out", v])
    views: tuple[str, ...] = setting(VIEWS, "--views", type=parse_views, default=",".join(VIEWS), metavar="LIST",
                                     help=f"timing views to time, a comma list of {', '.join(VIEWS)} (api always; "
                                          "default all); the table shows api and graph, or these when given",
                                     write=lambda v: [] if v == VIEWS else ["--views", ",".join(v)])
    graph_calls: int = setting(GRAPH_CALLS, "--graph-calls", type=count(), default=GRAPH_CALLS, metavar="N",
                               help=f"graph view: dispatch + combine pairs captured back to back in one CUDA graph "
                                    f"(default {GRAPH_CALLS})")
    soak: int = setting(0, "--soak", type=count(0, MAX_CALLS, "a million calls bound a rate below 3e-6"),
                        metavar="N",
                        help="after the timed calls, N more calls on freshly drawn tokens and routing (and N replays "
                             "of the graph view's graph), every one checked against the oracle: rare silent "
                             "corruption is FAIL with the calls and rows named (harness/soak.py)")
    soak_seconds: float = setting(0.0, "--soak-seconds", type=number(0, strict=True, high=MAX_WAIT_S), metavar="S",
                                  help="the soak's time budget (with --soak): it ends after N calls or S seconds, "
                                       "whichever comes first; a soak the budget ends with no call corrupted is "
                                       "BUDGET (exit 3), not FAIL, its bound taken over the calls made",
                                  write=lambda v: ["--soak-seconds", v] if v else [])
    repeats: int = setting(1, "--repeats", type=count(1, MAX_REPEATS, "each repeat starts every backend afresh"),
                           metavar="N",
                           help="run the case N times, every backend in fresh rank processes each time, the backend "
                                "order rotated by one every repeat; report --compare and megatron flags then judge "
                                "over the repeats' medians, paired by repeat (AWS's fair EP comparison; a soak runs "
                                "in the first repeat only)")
    soak_recreate: int = setting(0, "--soak-recreate", type=count(0, MAX_CALLS), metavar="N",
                                 help="with --soak: destroy and build the backend again every N soaked calls, timed "
                                      "(DeepEP V2's pressure test rebuilds per seed); the soak's record counts them")
    measure_ceiling: bool = True     # also time a plain all_to_all_single for frac_of_measured (NCCL runs)
    note: str = field(default="", compare=False)  # what placing the ranks wants said (CPU fallback, shared GPUs)

    @property
    def placement(self) -> Placement:
        return Placement(self.device, self.workload.ep, self.ranks_per_gpu, self.note)

    @property
    def functional(self) -> bool:
        """True when the times are not performance figures (CPU/gloo, or ranks sharing a GPU)."""
        return self.placement.functional

    @property
    def fault_plan(self) -> fault.Plan | None:
        return fault.Plan.parse(self.inject) if self.inject else None

    @property
    def watchdog(self) -> float:
        """moebench's watchdog after an injected fault: --watchdog, else --timeout."""
        return self.watchdog_s or self.timeout_s

    @property
    def pg_timeout(self) -> float:
        """The process group's own timeout: --pg-timeout, else --timeout (with --inject half of the watchdog)."""
        return self.pg_timeout_s or (self.watchdog / 2 if self.inject else self.timeout_s)

    @property
    def backend_knobs(self) -> dict:
        """The knobs every backend is given (ops_impl, num_sms, --knob), env:VAR ones left out."""
        return {k: v for k, v in self.knobs.items() if not k.startswith(ENV_KNOB)}

    @property
    def env(self) -> dict:
        """Environment variables for the rank processes, from the env:VAR knobs."""
        return {k[len(ENV_KNOB):]: str(v) for k, v in self.knobs.items() if k.startswith(ENV_KNOB)}

    def table_views(self, wide: bool) -> tuple[str, ...]:
        """The views the table shows: api and graph, or the ones --views named, or (--wide) all it timed."""
        return self.views if (wide or self.views != VIEWS) else tuple(v for v in ("api", "graph") if v in self.views)

    @classmethod
    def from_args(cls, args, workload: Workload | None = None) -> RunSpec:
        """From parsed dispatch flags; `workload` replaces the flags' shape (sweeps). Bad input raises
        WorkloadError."""
        overlap.parse(args.overlap)
        p = place(args.device, args.ep, args.ranks_per_gpu, joined_env())
        backends = _read_backends(args, {})
        vals = read_settings(cls, args, {"placement": p, "backends": backends})
        run = cls(workload=workload or _workload(args, p.device == "cpu"), note=p.note, **vals)
        bad = preflight.ops_impl_problem(run)
        if bad:
            raise WorkloadError(bad)
        return run

    @classmethod
    def from_argv(cls, argv: list[str]) -> RunSpec:
        p = Parser(prog="moebench.harness.spec")
        add_args(p)
        return cls.from_args(p.parse_args(argv))

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def check(self) -> RunSpec:
        """Bad input raises WorkloadError: a workload whose inputs alone would not fit, whatever the backends, an
        explicitly named backend that cannot take this run, or that would not fit in this machine's memory
        (preflight.py's estimates)."""
        if self.soak_seconds and not self.soak:
            raise WorkloadError("--soak-seconds is the budget of a soak: give --soak N too")
        if self.soak_recreate and not self.soak:
            raise WorkloadError("--soak-recreate rebuilds the backend during a soak: give --soak N too")
        if self.watchdog_s and not self.inject:
            raise WorkloadError("--watchdog is the watchdog of an injected fault: give --inject too")
        if self.inject and (bad := self.fault_plan.problem(self.workload.ep, self.iters) or (
                joined_env() and f"--inject {self.inject}: runs the ranks moebench starts, not under torchrun/srun "
                                 "(no process outside the job would watch them)")):
            raise WorkloadError(bad)
        too_big = preflight.workload_problem(self) or open_files_problem(self.workload.ep)
        if too_big:
            raise WorkloadError(too_big)
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
        argv = [t for f in dataclasses.fields(Workload) for t in (f.metadata["flag"], getattr(w, f.name))]
        argv += ["--backend", ",".join(self.backends) if self.explicit else "all"]
        return [str(a) for a in argv] + write_settings(self)


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags of one dispatch run: the Workload's and RunSpec's fields (moebench.dispatch adds the
    sweep flags and --wide to these)."""
    add_workload_args(p, cpu_shape=True)
    add_settings(p, RunSpec)


def _iters(args, device: str) -> int:
    """--iters, its default by device, at least TAIL_ITERS with --tails."""
    n = args.iters if args.iters is not None else DEFAULT_ITERS[device]
    return max(n, TAIL_ITERS) if args.tails else n


def _workload(args, cpu: bool) -> Workload:
    vals = {f.name: getattr(args, f.name) for f in dataclasses.fields(Workload)}
    for k, v in CPU_DEFAULT_SHAPE.items():
        if vals[k] is None:
            vals[k] = v if cpu else getattr(W0, k)
    return Workload(**vals)
