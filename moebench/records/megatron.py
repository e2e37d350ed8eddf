"""The records of `python -m moebench.megatron validate` / `arm` / `compare` (JSONL, one a line).

- ArmRecord: one launch of Megatron-LM's pretrain_gpt.py for one arm (the alltoall control or a
  candidate dispatcher) and one repeat; what Megatron logged, what ran on every rank, memory.
- VerdictRecord: one candidate against the control over all repeats of one validation.
- LoopRecord: one run of the built-in megatron-core training loop (the quick check).
Every record says which engine trained. Units live in key names.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

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
    command: list[str]                # the launch (torchrun ... lm_rank ... -- megatron_argv), or the launcher's
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


def arm_problem(r: dict) -> str:
    """'' for an arm record a verdict can be built on; else what is wrong with its shape."""
    from ..core.megatron_map import BACKENDS
    want = {"validation": str, "dispatcher": str, "status": str, "repeat": int, "iterations": list, "env": dict,
            "errors": list}
    for k, t in want.items():
        if not isinstance(r.get(k), t) or (t is int and isinstance(r.get(k), bool)):
            return f"an arm record without a valid {k!r} ({type(r.get(k)).__name__})"
    if r["dispatcher"] not in BACKENDS:
        return f"unknown dispatcher {r['dispatcher']!r} (known: {', '.join(BACKENDS)})"
    if r["status"] == "PASS" and not isinstance(r.get("steady"), dict):
        return "a PASS arm record without its steady window"
    return ""
