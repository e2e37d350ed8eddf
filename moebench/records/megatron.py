"""The records of `python -m moebench.megatron validate` / `arm` / `compare` (JSONL, one a line).

- ArmRecord: one launch of Megatron-LM's pretrain_gpt.py for one arm (the alltoall control or a
  candidate dispatcher) and one repeat; what Megatron logged, what ran on every rank, memory.
- VerdictRecord: one candidate against the control over all repeats of one validation.
- LoopRecord: one run of the built-in megatron-core training loop (the quick check).
Every record says which engine trained. Units live in key names.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .validate import COUNT_MAX, figure, show

ARM_SCHEMA = "moebench.megatron.arm/1"
VERDICT_SCHEMA = "moebench.megatron.verdict/1"
LOOP_SCHEMA = "moebench.megatron.validate/1"
FLAGS_SCHEMA = "moebench.megatron.flags/1"
ENGINE_LM = "megatron-lm pretrain_gpt.py"
ENGINE_LOOP = "moebench loop (megatron-core GPTModel, local spec, torch Adam)"


@dataclass
class ArmRecord:
    validation: str                   # joins the arms of one comparison: digest of their shared command
    role: str                         # control | candidate
    dispatcher: str                   # alltoall | deepep | hybridep (Megatron's values)
    repeat: int
    order: int                        # launch order within the validation (arms interleaved: A B A B)
    status: str                       # PASS | FAIL
    errors: list[str]
    megatron_argv: list[str]          # PATH/pretrain_gpt.py and its arguments, exactly as run
    command: list[str]                # the launch (torchrun ... lm.rank ... -- megatron_argv), or the launcher's
    dispatcher_flags: list[str]       # the flags only this arm has (megatron flags' Megatron-LM form)
    env_set: dict                     # environment set for this arm (the flags' env)
    flags: dict                       # megatron flags' FlagSet for this arm, notes included
    megatron_lm: dict                 # the checkout: path, version, commit, megatron-core used, notes
    no_te_flags: list[str] | None     # added because Transformer Engine is missing (None: TE is installed)
    launch: dict                      # launcher, nodes, ranks per node, world, EP, ranks per GPU, device
    window: int                       # steady window: the last N iterations
    iterations: list[dict]            # Megatron's per-iteration log (lm_log.Iteration)
    steady: dict | None               # over the window: mean/median/min/max elapsed ms, TFLOP/s/GPU
    memory: dict                      # {megatron: its memory reports, ranks: each rank's torch + driver view}
    evidence: list[dict]              # per rank: dispatchers that ran (calls), the comm buffer, arguments
    megatron_args: dict               # Megatron's own argument dump (rank 0), as printed
    error_lines: list[str]            # Megatron's last error lines when the arm failed
    functional: bool                  # CPU or shared-GPU ranks: the code trains, times are no measurement
    env: dict                         # provenance, container version where the environment names one
    wall_s: float
    log: str | None                   # the arm's full log
    start_utc: str
    end_utc: str
    engine: str = ENGINE_LM
    schema: str = field(default=ARM_SCHEMA, init=False)

    def asdict(self) -> dict:
        return asdict(self)


@dataclass
class VerdictRecord:
    validation: str
    control: str
    candidate: str
    verdict: str                      # SWITCH | KEEP | INCONCLUSIVE | FAIL
    reason: str
    ratio: float | None               # candidate / control, steady-window mean time per iteration
    ci95: list[float] | None          # bootstrap interval of the ratio (repeats, then iterations, resampled)
    min_gain: float                   # the candidate must save more than this fraction to SWITCH
    repeats: dict                     # {control: n, candidate: n} passing launches
    window: int
    loss: dict                        # {rtol, max_rel_diff, at_iteration, match}
    memory: list[dict]                # per rank: control and candidate max reserved / device bytes, deltas
    labels: list[str]                 # functional, benchmark-only (forced-balance routing)
    notes: list[str]                  # e.g. a moebench sha that differs between arms
    functional: bool
    end_utc: str
    engine: str = ENGINE_LM
    schema: str = field(default=VERDICT_SCHEMA, init=False)

    def asdict(self) -> dict:
        return asdict(self)


@dataclass
class LoopRecord:
    argv: list[str]
    repro: str
    device: str
    role: str
    dispatcher: str
    status: str
    errors: list[str]
    functional: bool
    result: dict                      # train.summarize(): step times, TFLOP/s, loss, memory, evidence
    env: dict
    end_utc: str
    shared_gpu: dict | None = None
    engine: str = ENGINE_LOOP
    schema: str = field(default=LOOP_SCHEMA, init=False)

    def asdict(self) -> dict:
        d = asdict(self)
        result = d.pop("result")
        return {**{k: v for k, v in d.items() if not (k == "shared_gpu" and v is None)}, **result}


@dataclass
class FlagsReport:
    """`megatron flags --json`: the decisions (A/B and flags) for a results file or a named backend."""
    megatron_core_version: str
    decisions: list[dict]
    schema: str = field(default=FLAGS_SCHEMA, init=False)

    def asdict(self) -> dict:
        return {"schema": self.schema, "megatron_core_version": self.megatron_core_version,
                "decisions": self.decisions}


ARM_STATUS = ("PASS", "FAIL")
ARM_TEXT = ("validation", "dispatcher", "status")
ARM_COUNTS = (("repeat", 0), ("order", 0), ("window", 1))      # (key, lowest value)
RANK_BYTES = ("max_reserved_bytes", "process_bytes", "device_used_bytes")


def arm_problem(r: dict) -> str:
    """'' for an arm record the table and the verdict can read; else its first problem, one phrase: a field
    they read that is missing or of the wrong type, or an impossible figure. A PASS arm's times and losses
    enter the verdict: each must be a finite number > 0 (a time also a plausible one, validate.figure); a
    FAIL arm's are only printed (its verdict is FAIL whatever they are): numbers, not necessarily possible."""
    return next((p for check in (_arm_top, _arm_steady, _arm_iterations, _arm_memory, _arm_evidence)
                 if (p := check(r))), "")


def _arm_top(r: dict) -> str:
    from ..core.megatron_map import BACKENDS
    p = (next((_wrong(k, r.get(k, _MISSING), "a non-empty string") for k in ARM_TEXT
               if not isinstance(r.get(k), str) or not r[k]), "")
         or next((p for k, low in ARM_COUNTS if (p := _count(r, k, low))), "")
         or next((p for k in ("errors", "megatron_argv") if (p := _strings(r, k))), ""))
    if p:
        return p
    if r["dispatcher"] not in BACKENDS:
        return f"unknown dispatcher {r['dispatcher']!r} (known: {', '.join(BACKENDS)})"
    if r["status"] not in ARM_STATUS:
        return _wrong("status", r["status"], " or ".join(ARM_STATUS))
    if not isinstance(r.get("env"), dict):
        return _wrong("env", r.get("env", _MISSING), "an object")
    if not isinstance(r.get("functional"), bool):
        return _wrong("functional", r.get("functional", _MISSING), "true or false")
    return ""


def _arm_steady(r: dict) -> str:
    st, judged = r.get("steady"), r["status"] == "PASS"
    if st is None:
        return "a PASS arm record without its steady window" if judged else ""
    if not isinstance(st, dict):
        return _wrong("steady", st, "an object")
    s = st.get("samples_ms", _MISSING)
    if not judged and (s is None or s is _MISSING):
        s = []
    if not isinstance(s, list):
        return _wrong("steady.samples_ms", s, "a list of times")
    if judged and not s:
        return "steady.samples_ms is empty: a PASS arm needs its steady-window times"
    p = (_figure("steady.mean_ms", st.get("mean_ms", _MISSING), judged)
         or next((p for i, v in enumerate(s) if (p := _figure(f"steady.samples_ms[{i}]", v, judged))), ""))
    t = st.get("tflops_per_gpu_mean")
    return p or (_figure("steady.tflops_per_gpu_mean", t, judged) if t is not None else "")


def _arm_iterations(r: dict) -> str:
    its, judged = r.get("iterations"), r["status"] == "PASS"
    if not isinstance(its, list):
        return _wrong("iterations", its, "a list of iterations")
    if judged and not its:
        return "iterations is empty: a PASS arm needs its loss curve"
    for n, it in enumerate(its):
        w = f"iterations[{n}]"
        if not isinstance(it, dict):
            return _wrong(w, it, "an object")
        loss = it.get("lm_loss")          # None: Megatron left it out (lm_log.Iteration)
        p = (_count(it, "iteration", 0, w + ".") or _count(it, "nan", 0, w + ".", needed=False)
             or _count(it, "skipped", 0, w + ".", needed=False)
             or (_figure(w + ".lm_loss", loss, judged) if loss is not None else ""))
        if p:
            return p
    return ""


def _arm_memory(r: dict) -> str:
    """memory: {megatron: Megatron's reports (MB), ranks: each rank's bytes}."""
    mem = r.get("memory")
    if mem is not None and not isinstance(mem, dict):
        return _wrong("memory", mem, "an object")
    for part in ("megatron", "ranks"):
        bad, rows = _list(mem or {}, part, "memory.")
        bad = bad or next((p for n, m in enumerate(rows) if (p := _memory_report(m, f"memory.{part}[{n}]"))), "")
        if bad:
            return bad
    return ""


def _memory_report(m, where: str) -> str:
    if not isinstance(m, dict):
        return _wrong(where, m, "an object")
    where += "."
    return (_count(m, "rank", 0, where, needed=False) or _megabytes(where, m.get("max_reserved_MB"))
            or next((p for k in RANK_BYTES if (p := _count(m, k, 0, where, needed=False))), ""))


def _arm_evidence(r: dict) -> str:
    """evidence: per rank, the dispatchers that ran, each {class, manager (null for none), calls}."""
    bad, ranks = _list(r, "evidence")
    for n, e in enumerate(ranks):
        w = f"evidence[{n}]"
        if not isinstance(e, dict):
            return _wrong(w, e, "an object")
        bad, ran = _list(e, "dispatchers", w + ".")
        bad = bad or next((p for i, d in enumerate(ran) if (p := _dispatcher(d, f"{w}.dispatchers[{i}]"))), "")
        if bad:
            return bad
    return bad


# ---- the phrases of arm_problem ----------------------------------------------------------------------------

_MISSING = object()


def _wrong(where: str, v, what: str) -> str:
    return f"{where} is {'missing' if v is _MISSING else show(v)}, not {what}"


def _count(d: dict, key: str, low: int, where: str = "", needed: bool = True) -> str:
    v = d.get(key, _MISSING)
    if (v is _MISSING or v is None) and not needed:
        return ""
    ok = isinstance(v, int) and not isinstance(v, bool) and low <= v <= COUNT_MAX
    return "" if ok else _wrong(where + key, v, f"an integer from {low} to 2^63-1")


def _list(d: dict, key: str, where: str = "") -> tuple[str, list]:
    """('', the list d[key]) (absent or null: empty), or (what is wrong, [])."""
    v = d.get(key)
    if v is None or isinstance(v, list):
        return "", v or []
    return _wrong(where + key, v, "a list"), []


def _dispatcher(d, where: str) -> str:
    """One dispatcher that ran on a rank: {class, manager (null: none), calls}."""
    if not isinstance(d, dict):
        return _wrong(where, d, "an object")
    if not isinstance(d.get("class"), str):
        return _wrong(where + ".class", d.get("class", _MISSING), "a string")
    m = d.get("manager", _MISSING)
    return "" if m is None or isinstance(m, str) else _wrong(where + ".manager", m, "a string or null")


def _strings(d: dict, key: str) -> str:
    v = d.get(key, _MISSING)
    if not isinstance(v, list):
        return _wrong(key, v, "a list of strings")
    return next((_wrong(f"{key}[{i}]", x, "a string") for i, x in enumerate(v) if not isinstance(x, str)), "")


def _figure(where: str, v, judged: bool) -> str:
    """validate.figure's phrase for a figure the verdict reads (judged); else only a number is needed."""
    if v is _MISSING:
        return f"{where} is missing"
    p = figure(where, v)
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    return "" if p is None or (number and not judged) else p.why


def _megabytes(where: str, v) -> str:
    """Megatron's max reserved MB (None: not reported): a finite number >= 0 whose bytes a 64-bit count holds."""
    if v is None:
        return ""
    where += "max_reserved_MB"
    p = figure(where, v, zero_ok=True)
    if p is None and v * 2**20 > COUNT_MAX:
        return f"{where} is {v:g}: more bytes than a 64-bit count holds"
    return p.why if p else ""
