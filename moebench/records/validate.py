"""What a usable record is: the fields the offline tools read, with their types, and figures that may enter
a verdict. Each rule gives the first problem of a record as one short phrase (`Problem`), or None.

Why here: each tool used to judge its input by whatever it indexed, so a record of the wrong shape was a
traceback and a NaN or 0 figure became a verdict (issue 35). A problem is either a wrong shape (the record
cannot be read as its kind) or an impossible figure (it reads, but a time or a bandwidth in it is not a
finite number > 0, or its p10/median/p90 are out of order): records/reader.py skips the first kind and
counts it, and the tools that judge refuse the second (skipping a measured row would change a verdict
without a word).
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

from .check import SCHEMA as CHECK_SCHEMA
from .schema import PERMUTE_SCHEMA, SCHEMA
from .shapes import MEMORY_KEYS, SETUP_KEYS

WORKLOAD_KEYS = ("num_tokens", "hidden", "num_experts", "topk", "ep", "dtype", "routing", "seed", "gpus_per_node")
TEXT_KEYS = ("dtype", "routing")
COUNT_MAX = 2**63 - 1                 # what a count or seed of a real run fits in (torch's int64)
TIMES = ("median_us", "p10_us", "p90_us", "min_us", "p99_us", "p999_us")
VIEW_TIMES = ("us", "median_us", "mean_us", "max_over_ranks_us", "p99_us", "p999_us")
# (bandwidth, the bytes it carries): a bandwidth is 0 only where its bytes are
BANDWIDTHS = (("algbw_GBps", "bytes"), ("busbw_GBps", "bus_bytes"), ("nvlink_GBps", "nvlink_bytes"),
              ("net_GBps", "net_bytes"), ("wirebw_GBps", "wire_bytes"))
# what a measured figure can be, by its unit (the key, or its ending after "_"): 1 ns to 11 days, up to 100 TB/s
# (HBM and NVLink are under 10), bytes a 64-bit count holds; outside, it is no measurement (1e-300 us won)
PLAUSIBLE = {"us": (1e-3, 1e12), "ms": (1e-6, 1e9), "GBps": (0.0, 1e5), "bytes": (0.0, float(COUNT_MAX))}
OVERLAP_TIMES = ("comm_alone_us", "gemm_alone_us", "gemm_alone_p90_us", "overlapped_us", "overlapped_p10_us",
                 "overlapped_p90_us", "gemm_overlapped_us", "gemm_slowdown")


class Problem(NamedTuple):
    why: str
    figure: bool = False      # an impossible number in a record of the right shape


def kind(obj) -> str:
    """'dispatch', 'row' (a bandwidth row of check --baseline), 'check' (a check --out report),
    'permute', another record's schema, 'other' for an object of no known kind, or what the JSON value is."""
    if not isinstance(obj, dict):
        return show(obj)
    schema = obj.get("schema")
    if schema == PERMUTE_SCHEMA or obj.get("tool") == "moebench.permute":   # early permute records: SCHEMA
        return "permute"
    if schema == SCHEMA or (schema is None and "GBps" not in obj and ("workload" in obj or "backend" in obj)):
        return "dispatch"
    if schema == CHECK_SCHEMA or (schema is None and "results" in obj):
        return "check"
    if schema is None and "GBps" in obj:
        return "row"
    return schema if isinstance(schema, str) else "other"


def show(v) -> str:
    """A JSON value as a message names it: short values as written, the rest by their type."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        digits = len(str(abs(v)))
        return str(v) if digits <= 20 else f"a {digits}-digit integer"
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return repr(v) if len(v) <= 40 else repr(v[:37] + "...")
    return {list: "a JSON list", dict: "a JSON object"}.get(type(v), type(v).__name__)


def _is(v, types) -> bool:
    """isinstance, where a boolean is no number (JSON's true is not 1)."""
    types = types if isinstance(types, tuple) else (types,)
    return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)


def _typed(d: dict, key: str, where: str, types, what: str, required: bool = False) -> Problem | None:
    """d[key] of `types` (None allowed unless required)."""
    if key not in d or d[key] is None:
        return Problem(f"{where}{key} is {'missing' if key not in d else 'null'}") if required else None
    if not _is(d[key], types) or (types is str and required and not d[key]):
        return Problem(f"{where}{key} is {show(d[key])}, not {what}")
    return None


def _count(d: dict, key: str, where: str, low: int = 1) -> Problem | None:
    v = d.get(key)
    if v is not None and not (_is(v, int) and low <= v <= COUNT_MAX):
        return Problem(f"{where}{key} is {show(v)}, not an integer from {low} to 2^63-1")
    return None


def figure(where: str, v, zero_ok: bool = False, signed: bool = False) -> Problem | None:
    """A time, bandwidth or ratio: a finite number > 0 (>= 0 with zero_ok; any sign with signed)."""
    if not _is(v, (int, float)):
        return Problem(f"{where} is {show(v)}, not a number", figure=True)
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not (math.isfinite(f) and (signed or f > 0 or (zero_ok and f == 0))):
        return Problem(f"{where} is {show(v)}: not a finite number {'>= 0' if zero_ok else '> 0'}", figure=True)
    unit = re.sub(r"\[\d+\]$", "", where).rsplit(".", 1)[-1].rsplit("_", 1)[-1]      # views.x.samples_us[3]: us
    lo, hi = PLAUSIBLE.get(unit, (0.0, math.inf))
    if f and not lo <= f <= hi:
        return Problem(f"{where} is {show(v)}: outside what a measurement can be ({lo:g} to {hi:g} "
                       f"{unit.replace('GBps', 'GB/s')})", figure=True)
    return None


def _figures(d: dict, keys, where: str, **kw) -> Problem | None:
    return next((p for k in keys if d.get(k) is not None and (p := figure(where + k, d[k], **kw))), None)


def _samples(d: dict, where: str) -> Problem | None:
    """samples_us and per_rank_us (records/shapes.Tails): lists of times; the straggler's rank and share."""
    for key in ("samples_us", "per_rank_us"):
        s = d.get(key)
        if s is not None and not isinstance(s, list):
            return Problem(f"{where}{key} is {show(s)}, not a list of times")
        if p := next((p for i, v in enumerate(s or []) if (p := figure(f"{where}{key}[{i}]", v))), None):
            return p
    share = d.get("slowest_rank_share")
    if share is not None and (p := figure(f"{where}slowest_rank_share", share) or (
            Problem(f"{where}slowest_rank_share is {show(share)}: not a fraction of the iterations", True)
            if share > 1 else None)):
        return p
    return _count(d, "slowest_rank", where, low=0)


def _ordered(d: dict, where: str) -> Problem | None:
    p10, med, p90 = (d.get(k) for k in ("p10_us", "median_us", "p90_us"))
    if None in (p10, med, p90) or p10 <= med * (1 + 1e-9) and med <= p90 * (1 + 1e-9):
        return None
    return Problem(f"{where}p10_us {show(p10)}, median_us {show(med)}, p90_us {show(p90)} are out of order",
                   figure=True)


def _timing(t, where: str = "timing.") -> Problem | None:
    if t is None:
        return None
    if not isinstance(t, dict):
        return Problem(f"{where[:-1]} is {show(t)}, not an object")
    if t.get("median_us") is None:              # a timing without its figure: no record has one
        return Problem(f"{where}median_us is {'missing' if 'median_us' not in t else 'null'}")
    return (_figures(t, TIMES, where) or _samples(t, where) or _count(t, "iters", where) or _ordered(t, where))


def _views(views) -> Problem | None:
    if views is None:
        return None
    if not isinstance(views, dict):
        return Problem(f"views is {show(views)}, not an object")
    for name, v in views.items():
        where = f"views.{name}."
        if not isinstance(v, dict):
            return Problem(f"views.{name} is {show(v)}, not an object")
        if "none" in v or "fail" in v:
            continue
        if p := _figures(v, VIEW_TIMES, where) or _samples(v, where):
            return p
    return None


def _traffic(tr) -> Problem | None:
    if tr is None:
        return None
    if not isinstance(tr, dict):
        return Problem(f"traffic is {show(tr)}, not an object")
    if p := _figures(tr, ("pairs",) + tuple(b for _, b in BANDWIDTHS), "traffic.", zero_ok=True):
        return p
    for bw, carried in BANDWIDTHS:
        moved = tr.get(carried)
        if tr.get(bw) is not None and (p := figure(f"traffic.{bw}", tr[bw], zero_ok=not (moved and moved > 0))):
            return p if not moved else Problem(f"{p.why} while traffic.{carried} is {show(moved)}", True)
    return (_figures(tr, ("ceiling_GBps", "measured_ceiling_GBps"), "traffic.")
            or _figures(tr, ("frac_of_ceiling", "frac_of_measured"), "traffic.", zero_ok=True))


def _overlap(o) -> Problem | None:
    if o is None:
        return None
    if not isinstance(o, dict):
        return Problem(f"overlap is {show(o)}, not an object")
    missing = next((k for k in (*OVERLAP_TIMES, "exposed_us", "gemm") if o.get(k) is None), None)
    if missing:
        return Problem(f"overlap.{missing} is {'missing' if missing not in o else 'null'}")
    return (_typed(o, "gemm", "overlap.", str, "a string") or _figures(o, OVERLAP_TIMES, "overlap.")
            or figure("overlap.exposed_us", o["exposed_us"], signed=True))


def _memory(m) -> Problem | None:
    """memory: {max: {MEMORY_KEYS: bytes}, per_rank: [objects], source/none/note: strings} (shapes.Memory)."""
    if m is None:
        return None
    if not isinstance(m, dict):
        return Problem(f"memory is {show(m)}, not an object")
    p = (_typed(m, "max", "memory.", dict, "an object") or _typed(m, "per_rank", "memory.", list, "a list")
         or next((p for k in ("source", "none", "note") if (p := _typed(m, k, "memory.", str, "a string"))), None))
    if p:
        return p
    if any(not isinstance(x, dict) for x in m.get("per_rank") or []):
        return Problem("memory.per_rank holds an entry that is not an object")
    top = m.get("max") or {}
    return next((p for k in MEMORY_KEYS if top.get(k) is not None
                 and (p := _count(top, k, "memory.max.", low=0))), None)


def _setup(s) -> Problem | None:
    """setup: {per_rank: [objects], max: {SETUP_KEYS: ms}, setup_ms} (shapes.Setup); records before it have none."""
    if s is None:
        return None
    if not isinstance(s, dict):
        return Problem(f"setup is {show(s)}, not an object")
    if p := _typed(s, "per_rank", "setup.", list, "a list") or _typed(s, "max", "setup.", dict, "an object"):
        return p
    return (_figures(s.get("max") or {}, SETUP_KEYS, "setup.max.", zero_ok=True)
            or _figures(s, ("setup_ms",), "setup.", zero_ok=True))


def _fault(f) -> Problem | None:
    """fault: {injected, verdict: strings, ranks: [objects], after_s} (shapes.Fault, --inject)."""
    if f is None:
        return None
    if not isinstance(f, dict):
        return Problem(f"fault is {show(f)}, not an object")
    return (_typed(f, "injected", "fault.", str, "a fault", required=True)
            or _typed(f, "verdict", "fault.", str, "a verdict", required=True)
            or _typed(f, "ranks", "fault.", list, "a list")
            or _figures(f, ("after_s",), "fault.", zero_ok=True))


def _workload(r: dict, need) -> Problem | None:
    w = r.get("workload")
    if not isinstance(w, dict):
        return Problem("workload is missing" if "workload" not in r else f"workload is {show(w)}, not an object")
    for k, v in w.items():
        if isinstance(v, (dict, list)):
            return Problem(f"workload.{k} is {show(v)}, not a single value")
    for k in need:
        if w.get(k) is None:
            return Problem(f"workload.{k} is missing")
    for k in WORKLOAD_KEYS:
        p = (_typed(w, k, "workload.", str, "a string") if k in TEXT_KEYS else
             _count(w, k, "workload.", low=0 if k == "seed" else 1))
        if p:
            return p
    return None


def _object(r: dict, key: str) -> Problem | None:
    if not isinstance(r.get(key), dict):
        return Problem(f"{key} is missing" if key not in r else f"{key} is {show(r[key])}, not an object")
    return None


def _parts(r: dict) -> Problem | None:
    """backend, phase, check and the small parts the tools read (env, sweep tag, shared-GPU note)."""
    if p := _object(r, "backend") or _object(r, "check"):
        return p
    if p := next((p for k in ("env", "sweep", "shared_gpu") if (p := _typed(r, k, "", dict, "an object"))), None):
        return p
    b, c = r["backend"], r["check"]
    env, tag, shared = r.get("env") or {}, r.get("sweep") or {}, r.get("shared_gpu") or {}
    return (_typed(b, "name", "backend.", str, "a backend name", required=True)
            or _typed(b, "knobs", "backend.", dict, "an object")
            or _count(b.get("knobs") or {}, "num_sms", "backend.knobs.", low=0)      # 0: the library picks (deepep-v2)
            or _typed(r, "phase", "", str, "a phase name", required=True)
            or _typed(c, "status", "check.", str, "a status", required=True)
            or _typed(c, "error", "check.", str, "a string")
            or _typed(r, "device", "", str, "a device name")
            or _typed(r, "functional", "", bool, "true or false")
            or _typed(env, "env", "env.", dict, "an object") or _typed(env, "gpu", "env.", str, "a string")
            or _typed(tag, "case", "sweep.", str, "a string") or _typed(tag, "knobs", "sweep.", dict, "an object")
            or (_typed(shared, "ranks_per_gpu", "shared_gpu.", int, "a count", required=True)
                or _count(shared, "ranks_per_gpu", "shared_gpu.") if shared else None))


SHA256 = re.compile(r"[0-9a-f]{64}")


def _repeat(r: dict) -> Problem | None:
    """The input digests (64 hex digits each) and the repeat tag {index < of, of, order, run} (shapes.Repeat)."""
    for key in ("routing_sha256", "payload_sha256"):
        v = r.get(key)
        if v is not None and not (isinstance(v, str) and SHA256.fullmatch(v)):
            return Problem(f"{key} is {show(v)}, not a SHA-256 in hex")
    rep = r.get("repeat")
    if rep is None:
        return None
    if not isinstance(rep, dict):
        return Problem(f"repeat is {show(rep)}, not an object")
    p = (next((p for k in ("index", "of") if (p := _typed(rep, k, "repeat.", int, "a count", required=True))), None)
         or _count(rep, "index", "repeat.", low=0) or _count(rep, "of", "repeat.")
         or _typed(rep, "run", "repeat.", str, "a string", required=True) or _typed(rep, "order", "repeat.", list, "a list"))
    if p is None and rep["index"] >= rep["of"]:
        p = Problem(f"repeat.index {rep['index']} is not below repeat.of {rep['of']}")
    return p


def dispatch_problem(r: dict, need=WORKLOAD_KEYS) -> Problem | None:
    """The first problem of a moebench.dispatch record, or None. need: the workload keys the tool reads."""
    return (_workload(r, need) or _parts(r) or _repeat(r) or _timing(r.get("timing")) or _views(r.get("views"))
            or _traffic(r.get("traffic")) or _overlap(r.get("overlap")) or _memory(r.get("memory"))
            or _setup(r.get("setup")) or _fault(r.get("fault")))


def row_problem(row, where: str = "") -> Problem | None:
    """A bandwidth row of check --baseline: {workload, backend, phase: strings, GBps > 0}."""
    if not isinstance(row, dict):
        return Problem(f"{where[:-1] or 'the row'} is {show(row)}, not an object")
    return (next((p for k in ("workload", "backend", "phase")
                  if (p := _typed(row, k, where, str, "a string", required=True))), None)
            or (figure(f"{where}GBps", row["GBps"]) if "GBps" in row else Problem(f"{where}GBps is missing"))
            or _typed(row, "functional", where, bool, "true or false"))


def report_rows(doc: dict) -> tuple[list[dict], list[Problem]]:
    """The bandwidth rows of a moebench.check report (results[i].details.rows) and the problems of the rest."""
    results = doc.get("results")
    if not isinstance(results, list):
        return [], [Problem(f"results is {show(results)}, not a list")]
    rows, bad = [], []
    for i, res in enumerate(results):
        details = res.get("details") if isinstance(res, dict) else None
        found = details.get("rows") if isinstance(details, dict) else None
        if not isinstance(res, dict):
            bad.append(Problem(f"results[{i}] is {show(res)}, not an object"))
        elif not isinstance(details, (dict, type(None))) or not isinstance(found, (list, type(None))):
            bad.append(Problem(f"results[{i}].details is not an object with a list of rows"))
        else:
            for j, row in enumerate(found or []):
                p = row_problem(row, f"results[{i}].details.rows[{j}].")
                (bad.append(p) if p else rows.append(row))
    return rows, bad
