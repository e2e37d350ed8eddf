"""Reading Megatron-LM's own training log (pretrain_gpt.py's stdout).

What is read, in Megatron-LM's words (megatron/training/training.py `training_log`,
megatron/training/utils `report_memory`, megatron/training/arguments.py `_print_args`):

- the iteration line, printed by the last rank every `--log-interval` iterations:
  ` [date] iteration N/ M | consumed samples: ... | elapsed time per iteration (ms): X |
  throughput per GPU (TFLOP/s/GPU): Y | learning rate: ... | global batch size: ... | lm loss: L |
  ... | number of skipped iterations: S | number of nan iterations: N |`
  (the loss is left out of the line when it is NaN: Megatron prints a loss only when avg >= 0);
- the memory report, printed by each data-parallel rank 0 after the first iterations (and every
  `--log-memory-interval`): `[Rank R] (after N iterations) memory (MB) | allocated: a |
  max allocated: b | reserved: c | max reserved: d [| total device memory used: e]`;
- the argument dump (rank 0): `  name ........ value` between `---- arguments ----` and
  `---- end of arguments ----`;
- the last error lines, for an arm that failed.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)(.*)$")
ARGS_BEGIN = re.compile(r"-{4,} arguments -{4,}")
ARGS_END = re.compile(r"-{4,} end of arguments -{4,}")
ARG_LINE = re.compile(r"^\s+(\S+) \.{2,} ?(.*)$")
ERROR = re.compile(r"Traceback|Error|error:|Exception|Assertion|SIGSEGV|SIGABRT|Signal|signal|core dumped|"
                   r"CUDA|NCCL WARN|failed|Killed")
LAUNCHER = "torch/distributed/"          # a traceback of torchrun itself, not of a rank
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b")   # `Name: message`
ITER_KEYS = {                        # Megatron's field name -> the record's key
    "elapsed time per iteration (ms)": "elapsed_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "lm loss": "lm_loss",
    "number of skipped iterations": "skipped",
    "number of nan iterations": "nan",
    "grad norm": "grad_norm",
    "loss scale": "loss_scale",
    "learning rate": "learning_rate",
    "global batch size": "global_batch_size",
    "consumed samples": "consumed_samples",
    "load_balancing_loss": "load_balancing_loss",
}
MEMORY_KEYS = {"allocated": "allocated_MB", "max allocated": "max_allocated_MB", "reserved": "reserved_MB",
               "max reserved": "max_reserved_MB", "total device memory used": "device_used_MB"}


@dataclass
class Iteration:
    iteration: int
    train_iters: int
    elapsed_ms: float | None = None
    tflops_per_gpu: float | None = None
    lm_loss: float | None = None          # None: Megatron left it out (NaN) or the model has none
    skipped: int = 0                      # iterations skipped in this log interval
    nan: int = 0                          # NaN iterations in this log interval
    grad_norm: float | None = None
    loss_scale: float | None = None
    learning_rate: float | None = None
    global_batch_size: int | None = None
    consumed_samples: int | None = None
    load_balancing_loss: float | None = None


@dataclass
class MemoryReport:
    rank: int
    after_iterations: int
    allocated_MB: float | None = None
    max_allocated_MB: float | None = None
    reserved_MB: float | None = None
    max_reserved_MB: float | None = None
    device_used_MB: float | None = None


@dataclass
class MegatronLog:
    iterations: list[Iteration] = field(default_factory=list)
    memory: list[MemoryReport] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)        # Megatron's argument dump, as printed
    error_lines: list[str] = field(default_factory=list)      # the last lines that look like an error

    def asdict(self) -> dict:
        return asdict(self)

    @property
    def skipped(self) -> int:
        return sum(i.skipped for i in self.iterations)

    @property
    def nan(self) -> int:
        return sum(i.nan for i in self.iterations)


def _number(text: str):
    text = text.strip()
    try:
        v = float(text)
    except ValueError:
        return None
    return int(v) if v.is_integer() and "." not in text and "e" not in text.lower() else v


def _fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_iteration(line: str) -> Iteration | None:
    m = ITERATION.search(line)
    if not m:
        return None
    it = Iteration(int(m.group(1)), int(m.group(2)))
    for name, value in _fields(m.group(3)).items():
        key = ITER_KEYS.get(name)
        if key is None:
            continue
        v = _number(value)
        if key in ("skipped", "nan"):
            v = int(v or 0)
        elif key == "lm_loss" and v is not None and not math.isfinite(v):
            v = None
        setattr(it, key, v)
    return it


def parse_memory(line: str) -> MemoryReport | None:
    m = MEMORY.search(line)
    if not m:
        return None
    rep = MemoryReport(int(m.group(1)), int(m.group(2)))
    for name, value in _fields(m.group(3)).items():
        if name in MEMORY_KEYS:
            setattr(rep, MEMORY_KEYS[name], _number(value))
    return rep


def parse(text_or_lines) -> MegatronLog:
    """Everything above from a log (a string, or lines). An iteration logged twice (two ranks printing,
    a restarted arm) keeps its last line."""
    lines = text_or_lines.splitlines() if isinstance(text_or_lines, str) else list(text_or_lines)
    log, iters, in_args = MegatronLog(), {}, False
    for line in lines:
        if ARGS_BEGIN.search(line) and not ARGS_END.search(line):
            in_args = True
            continue
        if in_args:
            if ARGS_END.search(line):
                in_args = False
            elif (a := ARG_LINE.match(line)):
                log.args[a.group(1)] = a.group(2).strip()
            continue
        if (it := parse_iteration(line)) is not None:
            iters[it.iteration] = it
        elif (mem := parse_memory(line)) is not None:
            log.memory.append(mem)
    log.iterations = [iters[k] for k in sorted(iters)]
    log.error_lines = error_tail(lines)
    return log


def error_tail(lines: list[str], keep: int = 12) -> list[str]:
    """Megatron's last error lines for an arm that failed: the first exception a rank raised (the root
    cause: the launcher's own traceback, and the other ranks', follow it; ranks that fail together may
    interleave their lines), with the traceback lines above it, at most `keep` lines; else the last lines
    that look like an error."""
    lines = [ln.rstrip() for ln in lines if ln.strip()]
    for i, ln in enumerate(lines):
        if EXCEPTION.match(ln) and not any(LAUNCHER in x for x in lines[max(0, i - 8):i + 1]):
            top = max((j for j in range(i) if lines[j].lstrip().startswith("Traceback")), default=i)
            return lines[max(top, i - keep + 1):i + 1]
    return [ln for ln in lines if ERROR.search(ln)][-keep:]
