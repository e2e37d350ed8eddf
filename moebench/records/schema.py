"""moebench's records: one dataclass per tool's JSONL record, and the accessors that report, flags,
plan, knobs and the checks read records through (records/reader.py reads them back and checks them).

Units live in key names (_us, _GBps, _bytes). A record is written as its dataclass's dict; readers
get plain dicts back (older files may lack newer fields: the accessors give their defaults).
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass, field

from .shapes import quantile

SCHEMA = "moebench.result/1"           # moebench.dispatch, one record per case x backend x phase
PERMUTE_SCHEMA = "moebench.permute/1"  # moebench.permute, one record per shape x impl x op
BYTE_RULE = "moebench/1: pairs = (token, destination rank); algbw incl. local, busbw remote only"
PHASES = ("dispatch", "combine")


def _compact(d: dict, optional: tuple[str, ...]) -> dict:
    return {k: v for k, v in d.items() if not (k in optional and v is None)}


@dataclass
class DispatchRecord:
    argv: list[str] | None
    repro: str
    workload: dict                   # Workload.asdict()
    device: str                      # cpu | cuda
    backend: dict                    # {name, version, knobs, dedup}
    phase: str                       # dispatch | combine | a backend's extra phase
    timing: dict | None              # shapes.Timing.asdict(); None when nothing was timed
    traffic: dict                    # the byte rule's pairs, bytes, GB/s, ceilings
    check: dict                      # {status: PASS | FAIL | WAIVED, error}
    env: dict                        # results.provenance()
    start_utc: str
    end_utc: str
    functional: bool                 # True: the times say the code works, not how fast (CPU/gloo)
    shared_gpu: dict | None = None   # several ranks on one GPU (functional too); None: one rank per GPU
    kernels: list | None = None      # the phase's largest kernels per call (CUDA; --profile on CPU: torch ops)
    views: dict | None = None        # {api, cached, kernel}: the timing views (views.py); {"none": why} where absent
    overlap: dict | None = None      # --overlap: the phase under a concurrent GEMM (overlap.py)
    sweep: dict | None = None        # {name, case, knobs} for a sweep's records
    soak: dict | None = None         # --soak: shapes.Soak (phase "soak")
    memory: dict | None = None       # shapes.Memory: buffers, torch peaks, footprint per rank and max
    routing_sha256: str | None = None  # core/digest.py: every rank's top-k ids and weights as the backend got them
    payload_sha256: str | None = None  # ... and its tokens (and fp8 scales)
    repeat: dict | None = None       # --repeats N: shapes.Repeat (which run of the case, the backend order)
    setup: dict | None = None        # shapes.Setup: group, build, first call (and --recreate) ms per rank and max
    fault: dict | None = None        # --inject: shapes.Fault, what the other ranks saw and the verdict
    byte_rule: str = BYTE_RULE
    schema: str = field(default=SCHEMA, init=False)

    def asdict(self) -> dict:
        return _compact(asdict(self), ("kernels", "sweep", "views", "overlap", "soak", "memory", "routing_sha256",
                                       "payload_sha256", "repeat", "setup", "fault"))


@dataclass
class PermuteRecord:
    command: str
    shape: dict                      # {T, H, K, E, R, dtype}
    impl: str                        # torch | triton[@...] | cuda[@V] | megatron | te
    op: str                          # permute | permute_wait | unpermute
    check: dict
    env: dict
    copy_GBps: float                 # the device-to-device copy bandwidth of the same run
    start_utc: str
    functional: bool
    end_utc: str | None = None
    timing: dict | None = None       # shapes.Timing.asdict()
    bytes: int | None = None         # unique bytes read + written
    GBps: float | None = None
    frac_of_copy: float | None = None
    speedup_vs_megatron: float | None = None
    speedup_vs_te: float | None = None       # over Transformer Engine's fused permute (ops/te_source.py)
    source: str | None = None                # where an anchor came from (te: installed, or from its sources)
    kernels: list | None = None
    host_us: float | None = None
    tool: str = "moebench.permute"
    schema: str = field(default=PERMUTE_SCHEMA, init=False)

    def asdict(self) -> dict:
        return _compact(asdict(self), ("timing", "bytes", "GBps", "frac_of_copy", "speedup_vs_megatron",
                                       "speedup_vs_te", "source", "kernels", "host_us", "end_utc"))


# ---- accessors -----------------------------------------------------------------------------------

def name(r: dict) -> str:
    return (r.get("backend") or {}).get("name")


def backend_knobs(r: dict) -> dict:
    """The knobs the record's backend ran with ({} where the record has none)."""
    return (r.get("backend") or {}).get("knobs") or {}


def status(r: dict) -> str | None:
    return (r.get("check") or {}).get("status")


EXIT_BUDGET = 3          # a soak its time budget ended before its N calls, none corrupted (no FAIL beside it)


def exit_code(records: list[dict]) -> int:
    """A tool's exit status from its records: 1 when any is FAIL, else 3 when a soak ran out of time (BUDGET),
    else 0."""
    found = {status(r) for r in records}
    return 1 if "FAIL" in found else EXIT_BUDGET if "BUDGET" in found else 0


def error(r: dict) -> str:
    return (r.get("check") or {}).get("error") or ""


def timing(r: dict) -> dict:
    return r.get("timing") or {}


def median_us(r: dict) -> float | None:
    return timing(r).get("median_us")


def traffic(r: dict) -> dict:
    return r.get("traffic") or {}


def gpu(r: dict) -> str | None:
    return (r.get("env") or {}).get("gpu")


def view_of(r: dict, name: str) -> dict:
    """A record's timing view `name` ({} where absent, or where it says why it has no figure: none / fail)."""
    v = (r.get("views") or {}).get(name) or {}
    return {} if "none" in v or "fail" in v else v


def view_timing(r: dict, view: str = "api") -> dict | None:
    """A record's timing in one timing view, shaped like `timing` (median_us, p10_us, p90_us, samples_us,
    iters): api is the record's own; cached and graph come from their per-iteration samples (max over
    ranks); None where the record has no such view with samples."""
    if view == "api":
        return r.get("timing") or None
    s = view_of(r, view).get("samples_us")
    if not s:
        return None
    t = sorted(s)
    return {"median_us": statistics.median(t), "p10_us": quantile(t, 0.10), "p90_us": quantile(t, 0.90),
            "samples_us": list(s), "iters": len(s)}


def view_us(r: dict, view: str) -> float | None:
    """A record's figure in a timing view, else None: the view's `us` (one shape, harness/views); records
    written before it keep theirs under `median_us` (api, graph: the median of the per-iteration max over
    ranks) or `mean_us` (cached: rank 0's)."""
    if view == "api":
        return median_us(r)
    v = view_of(r, view)
    return next((v[k] for k in ("median_us", "us", "mean_us") if v.get(k) is not None), None)


def footprint_bytes(r: dict) -> int | None:
    """The backend's footprint at this shape, the largest over ranks (shapes.Memory); None where not measured."""
    return ((r.get("memory") or {}).get("max") or {}).get("footprint_bytes")


def setup_ms(r: dict) -> float | None:
    """The backend's build + first call, the slowest rank's (shapes.Setup); None where not measured (older records)."""
    return (r.get("setup") or {}).get("setup_ms")


def largest_footprint(recs) -> int | None:
    """The largest footprint among records of one backend and case (its phases, its runs); None where unmeasured."""
    return max((b for r in recs if (b := footprint_bytes(r)) is not None), default=None)


def timed(r: dict) -> bool:
    """Checked PASS and timed."""
    return status(r) == "PASS" and median_us(r) is not None


def is_functional(r: dict) -> bool:
    """Times that say the code works, not how fast: CPU/gloo runs and ranks sharing a GPU.
    Records written before the `functional` field: a CPU device."""
    return bool(r.get("functional", r.get("device") == "cpu"))


FUNCTIONAL_NOTE = ("functional only (CPU/gloo or shared-GPU ranks): they show the code works, not how fast it "
                   "is, and are not performance evidence")


def performance_only(recs: list[dict], tool: str) -> list[dict]:
    """The records that may serve as performance evidence; says on stderr how many were left out (when
    any are kept)."""
    keep = [r for r in recs if not is_functional(r)]
    if keep and len(keep) < len(recs):         # none left: the caller says so in its error
        print(f"# {tool}: left out {len(recs) - len(keep)} record(s) that are {FUNCTIONAL_NOTE}", file=sys.stderr)
    return keep


TUNABLE = ("num_sms",)        # backend.knobs keys that count as a knob setting without sweep tags
MODES = ("mode", "zero_copy")  # backend.knobs keys that make another case, swept or not (ncclep ht / ll, zero copy)


def knobs_of(r: dict) -> dict:
    """The knob setting a record was run with: its mode, and its sweep tag, else the tunable backend knobs."""
    k = backend_knobs(r)
    tag = (r.get("sweep") or {}).get("knobs")
    return {**{n: k[n] for n in MODES if k.get(n) is not None},
            **(dict(tag) if tag else {n: v for n, v in k.items() if n in TUNABLE})}


def knob_str(r: dict) -> str:
    short = lambda k: k.replace("env:NUM_OF_TOKENS_PER_CHUNK_", "chunk_").replace("_API", "").lower()  # noqa: E731
    return " ".join(f"{short(k)}={v}" for k, v in sorted(knobs_of(r).items()))


def latest(records: list[dict]) -> list[dict]:
    """One record per (workload, backend, knobs, phase, device, GPU): the last one read wins, tagged
    `_runs` with how many runs of that case were read (tables say so; --compare pools them all)."""
    seen, runs = {}, {}
    for r in records:
        key = (json.dumps(r["workload"], sort_keys=True), name(r), knob_str(r), r.get("phase"),
               r.get("device"), gpu(r))
        seen[key] = r
        runs[key] = runs.get(key, 0) + 1
    return [{**r, "_runs": runs[k]} for k, r in seen.items()]


MATCHED_ENV = (("gpu", "GPU model"), ("gpu_count", "GPU count"), ("nccl", "NCCL"), ("driver", "driver"))


def env_difference(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(what makes two arms of an A/B incomparable: GPU model, GPU count, NCCL or driver differ; what is
    only worth naming: a different moebench sha). `a`, `b`: provenance dicts (a record's `env`)."""
    a, b = a or {}, b or {}
    refuse = [f"{what} {a.get(k)} vs {b.get(k)}" for k, what in MATCHED_ENV if a.get(k) != b.get(k)]
    note = [f"moebench {a.get('git_sha')} vs {b.get('git_sha')}"] if a.get("git_sha") != b.get("git_sha") else []
    return refuse, note
