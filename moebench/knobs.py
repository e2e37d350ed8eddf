"""Knobs: the names each backend reads, which setting a record ran with, and the fastest setting per
(backend, shape). The CLI checks `--knob` names here; sweeps, reports and `moebench.megatron flags`
read the settings from here."""
from __future__ import annotations

import json
import statistics

from . import record
from .workload import describe

TUNABLE = ("num_sms",)        # backend.knobs keys that count as a knob setting without sweep tags
ENV_KNOB = "env:"             # a knob env:VAR=V sets VAR for the rank processes instead of reaching the backend


def backend_knobs() -> dict[str, tuple[str, ...]]:
    """The knob names each backend reads from its knob_values (`--ops-impl` and `--num-sms` arrive as
    ops_impl and num_sms; mcore_cpu_emulation is for tests). tests/test_robust_knobs.py checks this
    table against the names the backend modules read."""
    from .backends.hybridep import SM_KNOBS
    deepep = ("num_sms", "ops_impl")
    mcore_flex = ("num_sms", "mcore_cpu_emulation", "moe_permute_fusion")
    return {"alltoall": ("ops_impl",), "deepep": deepep, "deepep-ll": deepep,
            "hybridep": ("mode", "num_sms", *SM_KNOBS, "ops_impl"),
            "mcore-alltoall": ("mcore_cpu_emulation", "moe_permute_fusion"),
            "mcore-deepep": mcore_flex, "mcore-hybridep": mcore_flex}


def unknown_knob(names, backends, flag: str = "--knob") -> str:
    """'' when every knob name is env:VAR or read by at least one of the backends; else one line
    naming the flag, the knob and the knob names those backends know."""
    known = backend_knobs()
    for n in names:
        if n.startswith(ENV_KNOB):
            if not n[len(ENV_KNOB):]:
                return f"{flag} {n}: env:VAR names no variable"
            continue
        if not any(n in known.get(b, ()) for b in backends):
            listed = "; ".join(f"{b}: {', '.join(known.get(b, ())) or 'none'}" for b in backends)
            return (f"{flag} {n}: no backend of this run reads a knob {n!r} (known: {listed}; "
                    f"or {ENV_KNOB}VAR=V for the rank processes' environment)")
    return ""


def knobs_of(r: dict) -> dict:
    """The knob setting a record was run with: its sweep tag, else the tunable backend knobs."""
    tag = r.get("sweep") or {}
    if tag.get("knobs"):
        return dict(tag["knobs"])
    return {k: v for k, v in ((r.get("backend") or {}).get("knobs") or {}).items() if k in TUNABLE}


def best_knobs(records) -> list[dict]:
    """The fastest knob setting per (backend, workload), from PASS records with timing.

    Arguments: records: JSONL records (any mix of sweeps and plain runs).
    Returns: one dict per (backend, workload) that has at least one knob setting timed in both
    phases: {backend, workload (Workload.asdict()), knobs, dispatch_us, combine_us, total_us,
    settings (how many settings were compared)}. The objective is dispatch + combine median us;
    repeated records of one setting are merged by the median of their medians.
    """
    groups: dict = {}
    for r in records:
        t = record.timing(r)
        if record.status(r) != "PASS" or "median_us" not in t:
            continue
        if r.get("phase") not in ("dispatch", "combine"):
            continue
        knobs = knobs_of(r)
        if not knobs:
            continue
        wkey = json.dumps(r["workload"], sort_keys=True)
        setting = groups.setdefault((record.name(r), wkey), {}).setdefault(
            json.dumps(knobs, sort_keys=True), {"dispatch": [], "combine": []})
        setting[r["phase"]].append(t["median_us"])
    out = []
    for (backend, wkey), settings in sorted(groups.items()):
        cands = [(statistics.median(v["dispatch"]) + statistics.median(v["combine"]), k, v) for k, v in settings.items()
                 if v["dispatch"] and v["combine"]]
        if not cands:
            continue
        total, k, v = min(cands, key=lambda c: c[0])
        out.append({"backend": backend, "workload": json.loads(wkey), "knobs": json.loads(k),
                    "dispatch_us": statistics.median(v["dispatch"]), "combine_us": statistics.median(v["combine"]),
                    "total_us": total, "settings": len(cands)})
    return out


def format_best(entries: list[dict], tablefmt: str = "simple") -> str:
    from tabulate import tabulate
    rows = [[e["backend"], describe(e["workload"]), " ".join(f"{k}={v}" for k, v in e["knobs"].items()),
             f"{e['dispatch_us']:.1f}", f"{e['combine_us']:.1f}", f"{e['total_us']:.1f}", e["settings"]]
            for e in entries]
    return tabulate(rows, headers=("backend", "shape", "best knobs", "dispatch us", "combine us",
                                   "total us", "settings"), tablefmt=tablefmt, disable_numparse=True)
