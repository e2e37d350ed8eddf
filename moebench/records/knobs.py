"""Knob settings in records: which setting a record ran with, and the fastest setting per (backend,
shape). Sweeps, reports and `moebench.megatron flags` read the settings from here; which knob names
and values a backend takes, each backend declares itself (backends/base.py)."""
from __future__ import annotations

import json
import statistics

from . import schema
from .schema import knobs_of


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
        t = schema.timing(r)
        if schema.status(r) != "PASS" or "median_us" not in t:
            continue
        if r.get("phase") not in ("dispatch", "combine"):
            continue
        knobs = knobs_of(r)
        if not knobs:
            continue
        wkey = json.dumps(r["workload"], sort_keys=True)
        setting = groups.setdefault((schema.name(r), wkey), {}).setdefault(
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
