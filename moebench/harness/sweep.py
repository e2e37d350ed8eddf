"""Named sweeps for `python -m moebench.dispatch --sweep NAME`: shapes from moebench/sweeps/NAME.toml,
the machine (EP, device, backends, iterations, seed, GPUs per node) from the command line.

A sweep file is TOML (or JSON) with `hidden`, `num_experts`, `topk`, `num_tokens` and optionally
`routing`, `dtype` (each a value or a list; the cases are their product) and `[knobs.BACKEND]`
tables of knob axes for `--knob-sweep`. A knob named `env:VAR` is set in the environment of the
rank processes (HybridEP reads its chunk sizes from there); any other knob is passed to the backend
(`num_sms`). Knob axes are searched one after another: the first in full, each later one with the
earlier axes fixed at their best setting so far; an axis's first value is its default.

Every case is (workload, backend, knobs). Records are appended to the JSONL right after each case,
tagged `sweep: {name, case, knobs}`; a rerun skips cases whose records are already there, so an
interrupted sweep resumes where it stopped. `knobs.best_knobs(records)` picks the fastest knob
setting per (backend, shape) (dispatch + combine median); `python -m moebench.megatron flags` uses it.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.base import REGISTRY, knob_problem
from .. import cli
from ..cli import Interrupted, count
from ..core.workload import Workload, WorkloadError
from ..env.toolkit import SWEEPS_DIR
from ..records import dispatch as dispatch_records, reader, schema, writer
from ..records.matrix import format_matrix, matrices
from ..records.knobs import best_knobs
from ..records.schema import knobs_of
from ..records.tables import format_best, sig3
from ..records.validate import COUNT_MAX, show
from . import join
from .eta import case_work, plan_works, time_left
from .launch import is_lead, join_problem, joined_env
from .runner import run_case
from .spec import RunSpec

SHAPE_KEYS = ("hidden", "num_experts", "topk", "num_tokens", "routing", "dtype")


@dataclass
class Sweep:
    name: str
    description: str
    axes: dict                                   # shape key -> list of values
    knobs: dict = field(default_factory=dict)    # backend -> {knob: [values]}


@dataclass(frozen=True)
class Case:
    w: Workload
    backend: str
    knobs: tuple = ()                            # sorted (knob, value) pairs

    @property
    def key(self) -> str:
        return case_key(self.w.asdict(), self.backend, dict(self.knobs))


def case_key(workload: dict, backend: str, knobs: dict) -> str:
    return json.dumps([workload, backend, knobs], sort_keys=True)


def add_args(p: argparse.ArgumentParser) -> None:
    """The sweep flags of `python -m moebench.dispatch`."""
    g = p.add_argument_group("sweeps")
    g.add_argument("--sweep", metavar="NAME", help=f"run a named sweep ({', '.join(known()) or 'none'}) "
                   "or a sweep file; appends to --out and resumes from it")
    g.add_argument("--knob-sweep", action="store_true",
                   help="with --sweep: sweep the [knobs.BACKEND] axes of the backends that have them")
    g.add_argument("--max-cases", type=count(), help="with --sweep: stop after running this many cases")
    g.add_argument("--redo-failed", action="store_true", help="with --sweep: rerun cases recorded as FAIL")


def modifier_problem(args) -> str:
    """'' unless a sweep modifier is given without --sweep (it would be ignored: a run the user did not ask for)."""
    given = [f for f, v in (("--knob-sweep", args.knob_sweep), ("--max-cases", args.max_cases is not None),
                            ("--redo-failed", args.redo_failed)) if v]
    return f"{given[0]} modifies a sweep: add --sweep NAME, or leave {given[0]} out" if given and not args.sweep else ""


def known() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.toml")) + sorted(p.stem for p in SWEEPS_DIR.glob("*.json"))


def resolve(name: str) -> Path:
    p = Path(name)
    if p.suffix in (".toml", ".json") or os.sep in name or (os.path.lexists(p) and name not in known()):
        if os.path.lexists(p):
            return p                   # the reader says what is wrong with it, if anything
        raise WorkloadError(f"sweep file {name}: no such file")
    for suffix in (".toml", ".json"):
        if (SWEEPS_DIR / (name + suffix)).is_file():
            return SWEEPS_DIR / (name + suffix)
    raise WorkloadError(f"unknown sweep {name!r} (known: {', '.join(known())}; or give a .toml/.json path)")


def load(name: str) -> Sweep:
    """Read and check a sweep definition; bad content raises WorkloadError (one line)."""
    path = resolve(name)
    try:
        raw = reader.load_document(path)
    except reader.RecordError as e:
        raise WorkloadError(f"sweep {e}") from None
    if not isinstance(raw, dict):
        raise WorkloadError(f"sweep {path}: holds {show(raw)}, not an object of sweep settings")
    unknown = set(raw) - set(SHAPE_KEYS) - {"description", "knobs"}
    if unknown:
        raise WorkloadError(f"sweep {path}: unknown keys {sorted(unknown)} (known: {', '.join(SHAPE_KEYS)}, "
                            "description, knobs)")
    missing = [k for k in ("hidden", "num_experts", "topk", "num_tokens") if k not in raw]
    if missing:
        raise WorkloadError(f"sweep {path}: missing {', '.join(missing)}")
    axes = {k: (raw[k] if isinstance(raw[k], list) else [raw[k]]) for k in SHAPE_KEYS if k in raw}
    for k, values in axes.items():
        want = str if k in ("routing", "dtype") else int
        bad = [v for v in values if not isinstance(v, want) or isinstance(v, bool)
               or (want is int and not 0 <= v <= COUNT_MAX)]
        if bad:
            raise WorkloadError(f"sweep {path}: {k} must be {'a string' if want is str else 'an integer up to 2^63-1'} "
                                f"(or a list of them), got {show(bad[0])}")
    if not isinstance(raw.get("description", ""), str):
        raise WorkloadError(f"sweep {path}: description must be a string, got {show(raw['description'])}")
    knobs = raw.get("knobs", {})
    if not isinstance(knobs, dict) or not all(isinstance(v, dict) for v in knobs.values()):
        raise WorkloadError(f"sweep {path}: [knobs.BACKEND] tables expected")
    knobs = {b: {k: (v if isinstance(v, list) else [v]) for k, v in kv.items()} for b, kv in knobs.items()}
    odd = next(((b, k, v) for b, kv in knobs.items() for k, vs in kv.items() for v in vs
                if not isinstance(v, (str, int, float)) or isinstance(v, float) and not math.isfinite(v)), None)
    if odd:
        raise WorkloadError(f"sweep {path}: [knobs.{odd[0]}] {odd[1]}: {show(odd[2])} is no knob value")
    for b, kv in knobs.items():
        bad = (f"unknown backend {b!r} (known: {', '.join(REGISTRY)})" if b not in REGISTRY else
               next((m for k, vs in kv.items() for v in vs if (m := knob_problem({k: v}, (b,), ""))), ""))
        if bad:
            raise WorkloadError(f"sweep {path}: [knobs.{b}]: {bad.strip()}")
    if not all([*axes.values(), *(v for kv in knobs.values() for v in kv.values())]):
        raise WorkloadError(f"sweep {path}: an axis has no values")
    return Sweep(path.stem, raw.get("description", ""), axes, knobs)


def workloads(s: Sweep, base: dict) -> list[Workload]:
    """The product of the sweep's axes over `base` (ep, seed, gpus_per_node, routing, dtype from the
    CLI); the sweep's own routing/dtype axes win. Invalid shapes raise WorkloadError."""
    keys = list(s.axes)
    out = []
    for values in itertools.product(*(s.axes[k] for k in keys)):
        fields = {**base, **dict(zip(keys, values))}
        try:
            out.append(Workload(**fields))
        except (WorkloadError, TypeError) as e:      # named by the sweep's keys where the value is the sweep's
            why = functools.reduce(lambda m, k: m.replace(f"--{k.replace('_', '-')}", k), keys, str(e))
            raise WorkloadError(f"sweep {s.name}: {why}") from None
    return out


def knob_stages(axes: dict, best: dict) -> list[list[dict]]:
    """Coordinate search: stage i varies axis i, earlier axes at `best` (else default), later at default."""
    names = list(axes)
    stages = []
    for i, name in enumerate(names):
        fixed = {n: best.get(n, axes[n][0]) for n in names[:i]}
        later = {n: axes[n][0] for n in names[i + 1:]}
        stages.append([{**fixed, name: v, **later} for v in axes[name]])
    return stages


def read_existing(path: str) -> list[dict]:
    """Records already in the JSONL: a line cut short by a kill, or any line no record can be read from, is
    skipped with a note and its case runs again; an output that is no regular file (/dev/null) holds none."""
    if not Path(path).is_file():
        return []
    try:
        return reader.read_dispatch([path], "moebench.dispatch --sweep (resume)", need=(), require=False)
    except reader.RecordError as e:           # a file it can write and not read
        raise WorkloadError(f"--out {e}") from None


def label(s: Sweep, case: Case) -> str:
    w = case.w
    extra = [f"{k}={w.asdict()[k]}" for k in s.axes if k not in ("num_tokens",) and len(s.axes[k]) > 1]
    knobs = " ".join(f"{k}={v}" for k, v in case.knobs)
    return " ".join([s.name, f"T={w.num_tokens}", *extra, f"EP={w.ep}", case.backend, knobs]).strip()


# ---- running -----------------------------------------------------------------------------------

def case_spec(base: RunSpec, case: Case) -> RunSpec:
    """The run of one case: the sweep's base spec with the case's workload, backend and knobs."""
    return base.replace(workload=case.w, backends=(case.backend,), explicit=True,
                        knobs={**base.knobs, **dict(case.knobs)})


def run_tagged(run: RunSpec, s: Sweep, case: Case) -> list[dict]:
    """Check and run one case's spec; tag its records with the sweep and the case."""
    recs = run_case(run.check(), progress=lambda m: None)
    for r in recs:
        r["sweep"] = tag(s, case)
    return recs


def tag(s: Sweep, case: Case) -> dict:
    return {"name": s.name, "case": case.key, "knobs": dict(case.knobs)}


def _summary_line(r: dict) -> str:
    t, tr = schema.timing(r), schema.traffic(r)
    med = f"{sig3(t['median_us']):>10} us" if t.get("median_us") is not None else "         - us"
    bw = f"busbw {sig3(tr['busbw_GBps']):>8} GB/s" if tr.get("busbw_GBps") is not None else ""
    err = f" ({r['check']['error']})" if r["check"].get("error") else ""
    return f"    {r['phase']:<9}{med}  {bw}  {r['check']['status']}{err}"


class SweepState:
    """Walks the cases of a sweep, skipping finished ones, appending records after every case."""

    def __init__(self, base: RunSpec, s: Sweep, records: list[dict], works: list[int], max_cases: int | None = None,
                 redo_failed: bool = False):
        self.base, self.s, self.records, self.works, self.total = base, s, records, works, len(works)
        self.max_cases, self.redo_failed = max_cases, redo_failed
        self.n = self.ran = self.skipped = 0
        self.failed: set[str] = set()
        self.statuses: set[str] = set()               # every record's check status, for the exit code
        self.refused: list[str] = []                    # cases this machine cannot run: "label: why"
        self.done = done_keys(records, redo_failed)
        self.history: list[tuple[int, float]] = []     # (work, seconds) of the cases run
        self.waivers: set | None = None
        self.job = joined_env()                         # a rank of a torchrun/srun job: rank 0 decides

    def agreed(self, value):
        """`value` as rank 0 has it: a job's ranks must choose alike (each reads its own --out)."""
        return value if self.job is None else join.from_rank0(self.job[0], value, self.base.timeout_s)

    def stop(self) -> bool:
        return self.max_cases is not None and self.ran >= self.max_cases

    def run(self, case: Case) -> None:
        self.n += 1
        head = f"[{self.n}/{self.total}] {label(self.s, case)}"
        if self.agreed(case.key in self.done):
            self.skipped += 1
            print(f"{head}: already in {self.base.out}, skipped")
            return
        left = time_left(self.history, self.works[self.n - 1:])
        print(head + (f" (~{left / 60:.1f} min left, by work)" if left is not None else ""), flush=True)
        t0 = time.monotonic()
        try:
            recs = run_tagged(case_spec(self.base, case), self.s, case)
        except WorkloadError as e:
            print(f"    refused: {e}")
            self.refused.append(f"{label(self.s, case)}: {e}")
            run = case_spec(self.base, case)            # the cell is a record too: the capability matrix shows it
            self.keep(dispatch_records.refused(run, case.backend, str(e), run.to_argv(), tag(self.s, case)))
            return
        self.history.append((case_work(case.w), time.monotonic() - t0))
        self.keep(recs)
        self.done |= done_keys(recs, self.redo_failed)     # keys only grow: no rescan of all records
        self.ran += 1
        for r in recs:
            print(_summary_line(r), flush=True)
            self.statuses.add(schema.status(r))
            if schema.status(r) == "FAIL":
                self.failed.add(label(self.s, case))

    def keep(self, recs: list[dict]) -> None:
        """Records to --out (rank 0 writes the job's) and to this run's list."""
        if is_lead():
            writer.write_jsonl(self.base.out, [r for r in recs if not self.repeats_waiver(r)])
        self.records += recs

    def repeats_waiver(self, r: dict) -> bool:
        """A WAIVED or REFUSED record the file already holds (same case, phase and reason): not appended again."""
        if schema.status(r) not in ("WAIVED", "REFUSED"):
            return False
        if self.waivers is None:
            self.waivers = {_waiver_key(x) for x in self.records if schema.status(x) in ("WAIVED", "REFUSED")}
        key = _waiver_key(r)
        seen = key in self.waivers
        self.waivers.add(key)
        return seen

    def best(self, case: Case) -> dict:
        mine = [r for r in self.records if r.get("workload") == case.w.asdict()
                and r.get("backend", {}).get("name") == case.backend]
        entries = best_knobs(mine)
        return self.agreed(entries[0]["knobs"] if entries else {})


def _waiver_key(r: dict) -> tuple:
    """A WAIVED or REFUSED cell: its case, phase, status and reason, the reason's figures left out (the memory free
    changes from run to run; the reason does not)."""
    why = re.sub(r"\d+(\.\d+)?", "#", schema.error(r))
    return (r.get("sweep") or {}).get("case"), r.get("phase"), schema.status(r), why


def done_keys(records: list[dict], redo_failed: bool = False) -> set[str]:
    """Keys of finished cases: records with PASS (or FAIL unless redo_failed). WAIVED cases rerun
    (cheap when the package is missing, and right after it was installed)."""
    keep = ("PASS",) if redo_failed else ("PASS", "FAIL")
    keys = set()
    for r in records:
        if schema.status(r) not in keep:
            continue
        tag = r.get("sweep") or {}
        keys.add(tag.get("case") or case_key(r.get("workload", {}), (r.get("backend") or {}).get("name"),
                                              knobs_of(r)))
    return keys


def walk(runner: SweepState, s: Sweep, wls: list[Workload], names: list[str], knob_sweep: bool) -> None:
    for w in wls:
        for name in names:
            axes = s.knobs.get(name) if knob_sweep else None
            if not axes:
                runner.run(Case(w, name))
                if runner.stop():
                    return
                continue
            for i in range(len(axes)):
                best = runner.best(Case(w, name))
                for knobs in knob_stages(axes, best)[i]:
                    runner.run(Case(w, name, tuple(sorted(knobs.items()))))
                    if runner.stop():
                        return


def _setup(args) -> tuple[Sweep, list[Workload], RunSpec]:
    """The sweep, its workloads and the base spec of its cases (machine and options from the flags)."""
    if args.num_tokens is not None or args.hidden is not None:
        raise WorkloadError("--sweep takes --num-tokens and --hidden from the sweep file; drop them")
    s = load(args.sweep)
    wls = workloads(s, {"ep": args.ep, "seed": args.seed, "gpus_per_node": args.gpus_per_node,
                        "routing": args.routing, "dtype": args.dtype})
    base = RunSpec.from_args(args, workload=wls[0])
    if args.knob_sweep:
        names = tuple(n for n in base.backends if n in s.knobs)
        if not names:
            raise WorkloadError(f"sweep {s.name} has no [knobs.BACKEND] table for {args.backend}")
        base = base.replace(backends=names)
    return s, wls, base


def main_sweep(args) -> int:
    """`python -m moebench.dispatch --sweep NAME [--knob-sweep] [--max-cases N]`."""
    try:
        s, wls, base = _setup(args)
        existing = read_existing(base.out)
        if not_joined := join_problem(base.timeout_s):
            raise WorkloadError(not_joined)
    except WorkloadError as e:
        cli.error("moebench.dispatch", e)
        return 2
    names, device, out = list(base.backends), base.device, base.out
    if base.note:
        print(f"# NOTE: {base.note}")
    if device == "cpu" and max(w.num_tokens * w.hidden for w in wls) > 1 << 22:
        print("# NOTE: full-size shapes on CPU/gloo are slow; a tiny sweep file suits a functional check")
    works = plan_works(s.knobs, wls, names, args.knob_sweep)
    total = len(works)
    print(f"# sweep {s.name}: {s.description} | {len(wls)} workloads x {', '.join(names)}"
          f"{' (knob sweep)' if args.knob_sweep else ''} = {total} cases, EP {args.ep}, device {device},"
          f" results -> {out}")
    runner = SweepState(base, s, existing, works, args.max_cases, args.redo_failed)
    try:
        walk(runner, s, wls, names, args.knob_sweep)
    except join.JoinError as e:
        cli.error("moebench.dispatch", f"{e}; {runner.ran} cases finished")
        return 1
    except KeyboardInterrupt as e:
        raise Interrupted.after(e, f"{runner.ran} cases finished and kept in {out}; rerun the same command to "
                                   "resume") from None
    print(f"# sweep {s.name}: ran {runner.ran}, skipped {runner.skipped} already in {out}"
          + (f", refused {len(runner.refused)}" if runner.refused else ""))
    if runner.stop() and runner.n < total:
        print(f"# stopped after {runner.ran} cases (--max-cases); rerun the same command to resume")
    if args.knob_sweep:
        wds = [w.asdict() for w in wls]
        best = [e for e in best_knobs(runner.records) if e["workload"] in wds and e["backend"] in names]
        print(format_best(best) if best else "# no knob setting passed with timing: nothing to pick")
    print(format_matrix(matrices([r for r in runner.records if (r.get("sweep") or {}).get("name") == s.name])))
    if device == "cpu":
        print("# CPU/gloo run: the times above are functional only, not performance figures")
    if runner.failed:
        print(f"# FAIL: {'; '.join(sorted(runner.failed))}", file=sys.stderr)
    if runner.refused:
        print(f"# REFUSED {len(runner.refused)} case(s), the first {runner.refused[0]}", file=sys.stderr)
    if runner.refused and not runner.ran and not runner.skipped:
        return 2                                        # no case of it can run here: bad input for this machine
    return schema.exit_code([{"check": {"status": st}} for st in runner.statuses])
