"""The capability matrix of a sweep (`report --matrix FILE`, and a sweep's end of run): one row per backend, one
column per case, each cell PASS / CLAMPED (passed with fewer SMs than asked) / WAIVED (could not run here) /
REFUSED (by the preflight, before any rank started) / FAIL, with a one-word reason, as CollectiveX records every
unsupported or clamped cell instead of dropping it (SemiAnalysisAI/InferenceX experimental/CollectiveX): where a
backend stops working is a result, not a gap (uccl#671 found its limit at EP 24 by hanging).

A cell is read from the sweep's records of that backend and case (their `sweep` tag): the last record of each phase
(a rerun of a failed case replaces it), FAIL where any phase FAILed, else REFUSED, WAIVED, CLAMPED, PASS.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from . import schema
from .tables import fit, shorten

STATES = ("PASS", "CLAMPED", "WAIVED", "REFUSED", "FAIL")
NOT_RUN = "-"
LEGEND = ("PASS: checked and timed; CLAMPED: passed with fewer SMs than asked; WAIVED: could not run here; REFUSED: by "
          "the preflight before any rank started; FAIL: crashed, hung or wrong; -: not run (yet)")
# (word, pattern) tried in order on a cell's error, lowercase: the first that matches names it
WORDS = (("hang", r"\bhang|timed out|\btimeout|did not finish"), ("oom", r"out of memory|sigkill|\boom\b"),
         ("crash", r"sig[a-z]{3,4}\b|segfault|core dumped|abort"), ("inputs", r"other inputs"),
         ("corrupt", r"\bsoak\b|corrupt"), ("memory", r"\bgib\b|memory|would not fit"),
         ("cuda", r"needs cuda|--device cuda|\bcpu\b"), ("package", r"not installed|no module|import|install|not built"),
         ("nccl", r"nccl"), ("shape", r"cannot take|divisible|must be|multiple of|--hidden|--topk|--num-|ranks per"),
         ("oracle", r"^(dispatch|combine)\b|byte rule|replay|oracle|wrong|mismatch|expected"))
FAIL_ONLY = {"oracle", "corrupt", "inputs"}       # words of a wrong result: a cell that never ran has none
SHORT = {"num_tokens": "T", "hidden": "H", "num_experts": "E", "topk": "K", "ep": "EP"}


@dataclass
class Cell:
    status: str                 # STATES
    reason: str = ""            # one word ('' for PASS)
    error: str = ""             # the whole reason, from the record


def reason(status: str, error: str, crash: str | None = None) -> str:
    """The one word of a cell's error: a killed rank's signal first, then WORDS; 'other' where none matches."""
    if status == "PASS":
        return ""
    if crash:
        return "hang" if crash == "hang" else "oom" if crash == "SIGKILL" else "crash"
    text = (error or "").lower()
    return next((w for w, pat in WORDS if (status == "FAIL" or w not in FAIL_ONLY) and re.search(pat, text)), "other")


def clamped(r: dict) -> bool:
    """Passed with fewer SMs than the run asked for (the knob asked, backend.knobs.num_sms_used reported)."""
    asked, used = schema.knobs_of(r).get("num_sms"), schema.backend_knobs(r).get("num_sms_used")
    return all(isinstance(v, int) and not isinstance(v, bool) for v in (asked, used)) and 0 < used < asked


def cell(recs: list[dict]) -> Cell:
    """The cell of one backend and case from its records (the last of each phase)."""
    last = {r.get("phase"): r for r in recs}
    by = {schema.status(r): r for r in last.values()}
    for status in ("FAIL", "REFUSED", "WAIVED"):
        if status in by:
            r = by[status]
            err = schema.error(r)
            return Cell(status, reason(status, err, (r.get("check") or {}).get("crash")), err)
    if any(clamped(r) for r in last.values()):
        r = next(r for r in last.values() if clamped(r))
        k = schema.backend_knobs(r)
        return Cell("CLAMPED", "sms", f"asked {schema.knobs_of(r)['num_sms']} SMs, used {k['num_sms_used']}")
    return Cell("PASS", "budget" if "BUDGET" in by else "")


def column(r: dict) -> str:
    """A record's case without its backend: workload and knobs, as one key."""
    return json.dumps([r.get("workload"), (r.get("sweep") or {}).get("knobs") or {}], sort_keys=True)


def matrices(records: list[dict]) -> list[dict]:
    """One matrix per sweep name in the records: {sweep, backends, cases: [(key, label)], cells: {(backend, key):
    Cell}, where}; records without a sweep tag are left out."""
    by_sweep: dict = {}
    for r in records:
        name = (r.get("sweep") or {}).get("name")
        if name:
            by_sweep.setdefault(name, []).append(r)
    out = []
    for name, recs in by_sweep.items():
        groups: dict = {}
        for r in recs:
            groups.setdefault((schema.name(r), column(r)), []).append(r)
        keys = list(dict.fromkeys(column(r) for r in recs))
        env = next((r.get("env") or {} for r in recs if (r.get("env") or {}).get("gpu")), {})
        out.append({"sweep": name, "backends": list(dict.fromkeys(schema.name(r) for r in recs)),
                    "cases": list(zip(keys, labels([json.loads(k) for k in keys]))),
                    "cells": {k: cell(v) for k, v in groups.items()},
                    "where": ", ".join(x for x in (recs[0].get("device"), env.get("gpu")) if x)})
    return out


def labels(cases: list) -> list[str]:
    """A short label per [workload, knobs]: the workload keys and knobs that differ between cases (T always)."""
    ws = [w or {} for w, _ in cases]
    vary = [k for k in (ws[0] if ws else {}) if k == "num_tokens" or len({json.dumps(w.get(k)) for w in ws}) > 1]
    out = []
    for w, knobs in cases:
        parts = [f"{SHORT.get(k, k)}={(w or {}).get(k)}" for k in vary] + [f"{k}={v}" for k, v in sorted(knobs.items())]
        out.append(" ".join(parts))
    return out


def text(cell_: Cell | None) -> str:
    if cell_ is None:
        return NOT_RUN
    return f"{cell_.status} {cell_.reason}".strip()


def format_matrix(ms: list[dict], markdown: bool = False) -> str:
    """Each sweep's matrix as a table (backends x cases), its title, and one legend line."""
    from tabulate import tabulate
    parts = []
    for m in ms:
        parts.append(("### " if markdown else "# ") + f"capability matrix: sweep {m['sweep']} ({len(m['backends'])} "
                     f"backends x {len(m['cases'])} cases{'; ' + m['where'] if m['where'] else ''})")
        rows = [[b, *(text(m["cells"].get((b, k))) for k, _ in m["cases"])] for b in m["backends"]]
        parts.append(tabulate(rows, headers=["backend", *(lb for _, lb in m["cases"])],
                              tablefmt="github" if markdown else "simple", disable_numparse=True))
        whys = {(c.status, c.reason): c.error for c in m["cells"].values() if c.error}
        parts += [("" if markdown else "# ") + f"{s} {w}: {shorten(e, 130)}" for (s, w), e in sorted(whys.items())]
    parts.append(("" if markdown else "# ") + LEGEND)
    return "\n".join(parts if markdown else fit(parts))


def as_json(ms: list[dict]) -> list[dict]:
    return [{"sweep": m["sweep"], "where": m["where"], "backends": m["backends"], "cases": [lb for _, lb in m["cases"]],
             "cells": [{"backend": b, "case": lb, **vars(c)} for (b, key), c in m["cells"].items()
                       for k, lb in m["cases"] if k == key]} for m in ms]
