"""Regression gate: compare this run's bandwidth rows with an earlier run's.

Row identity (one for every source of bandwidth figures):
    key = "<workload> | <backend> | <phase>"   with a figure GBps
- moebench.dispatch JSONL records: workload = "T{num_tokens} H{hidden} E{num_experts} K{topk} EP{ep}
  {dtype} {routing} seed{seed} gpn{gpus_per_node}", backend = backend.name, plus "/{mode}" when the
  record's knobs carry a `mode` (HybridEP permute/plain), phase = record phase;
  GBps = traffic.algbw_GBps (busbw_GBps when algbw is absent). Records without timing are skipped.
- the checks' own rows (p2p, nccl, round trips) are written in that form already, e.g.
  {"workload": "p2p 268435456 B", "backend": "sm-copy", "phase": "0->1", "GBps": 389.2}.
A baseline FILE may be a dispatch JSONL, a JSONL of such rows, or a `moebench.check --out` report.
A row whose figure fell by more than the threshold (default 10%) FAILs the gate, naming the row and
both figures; rows present on one side only are listed, not failed. Files are read by records/reader.py:
a malformed line is skipped and counted, a figure that is not a finite number > 0 refuses the file (no
gate is drawn from it); such a figure among this run's own rows FAILs the gate.
"""
from __future__ import annotations

from ..records import reader, schema, validate
from .registry import Context, failed, passed, register, waived

DEFAULT_THRESHOLD_PCT = 10.0


def workload_key(w: dict) -> str:
    return (f"T{w['num_tokens']} H{w['hidden']} E{w['num_experts']} K{w['topk']} EP{w['ep']} {w['dtype']} "
            f"{w['routing']} seed{w['seed']} gpn{w['gpus_per_node']}")


def rows_from_records(records: list[dict]) -> list[dict]:
    """Bandwidth rows from moebench.dispatch records (timed, checked ones that moved bytes)."""
    rows = []
    for r in records:
        t = schema.traffic(r)
        gbps = t.get("algbw_GBps") if t.get("algbw_GBps") is not None else t.get("busbw_GBps")
        if not r.get("timing") or gbps is None or not gbps > 0 or schema.status(r) != "PASS":
            continue
        b = r["backend"]
        mode = (b.get("knobs") or {}).get("mode")
        rows.append({"workload": workload_key(r["workload"]), "backend": b["name"] + (f"/{mode}" if mode else ""),
                     "phase": r["phase"], "GBps": float(gbps),
                     **({"functional": True} if schema.is_functional(r) else {})})
    return rows


def row_key(row: dict) -> str:
    return f"{row['workload']} | {row['backend']} | {row['phase']}"


def read_rows(path, tool: str | None = "moebench.check") -> list[dict]:
    """Bandwidth rows from a dispatch JSONL, a rows JSONL or a check JSON report, in file order.
    tool: the name of the note on stderr about skipped lines (None: no note). Raises reader.RecordError."""
    objs = reader.read([path], tool, kinds=("dispatch", "row", "check"), verdict=True)
    return [row for o in objs for row in ([o] if validate.kind(o) == "row" else rows_from_records([o]))]


def compare(baseline: list[dict], current: list[dict], threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> dict:
    """{'regressions': [...], 'compared': [...], 'only_baseline': [...], 'only_current': [...]}.
    Duplicate keys on a side keep their best figure (a repeated run)."""
    def best(rows):
        out: dict[str, float] = {}
        for r in rows:
            k = row_key(r)
            out[k] = max(out.get(k, float("-inf")), float(r["GBps"]))
        return out
    b, c = best(baseline), best(current)
    compared, regressions = [], []
    for k in sorted(b.keys() & c.keys()):
        change = (c[k] - b[k]) / b[k] * 100.0
        item = {"row": k, "baseline_GBps": b[k], "current_GBps": c[k], "change_pct": round(change, 2)}
        compared.append(item)
        if -change > threshold_pct:
            regressions.append(item)
    return {"regressions": regressions, "compared": compared, "threshold_pct": threshold_pct,
            "only_baseline": sorted(b.keys() - c.keys()), "only_current": sorted(c.keys() - b.keys())}


def describe(item: dict) -> str:
    return (f"{item['row']}: {item['baseline_GBps']:.1f} -> {item['current_GBps']:.1f} GB/s "
            f"({item['change_pct']:+.1f}%)")


@register("baseline", "regression gate: bandwidth rows against --baseline FILE (drop beyond --threshold fails)")
def check_baseline(ctx: Context):
    o = ctx.options
    if not getattr(o, "baseline", None):
        return waived("no --baseline FILE given")
    base = read_rows(o.baseline, None)     # check.py read it before any check ran: refused, or skipped lines noted
    current = [r for res in ctx.results for r in res.rows]
    impossible = [" | ".join(str(r.get(k)) for k in ("workload", "backend", "phase")) + f": {p.why}"
                  for r in current if (p := validate.row_problem(r))]
    if impossible:
        return failed(f"{len(impossible)} row(s) of this run hold no usable figure, so no gate: "
                      + "; ".join(impossible[:3]))
    for f in getattr(o, "results", None) or []:
        current += read_rows(f, None)
    if base and all(r.get("functional") for r in base):
        return failed(f"--baseline {o.baseline}: every row is {schema.FUNCTIONAL_NOTE}; gate against a GPU run")
    dropped = sum(1 for r in current if r.get("functional"))
    base, current = [r for r in base if not r.get("functional")], [r for r in current if not r.get("functional")]
    if dropped and not current:
        return waived(f"the {dropped} current row(s) are {schema.FUNCTIONAL_NOTE}: no gate on this machine")
    res = compare(base, current, o.threshold)
    if not res["compared"]:
        return waived(f"no rows in common with {o.baseline} ({len(base)} baseline, {len(current)} current rows)", **res)
    if res["regressions"]:
        worst = sorted(res["regressions"], key=lambda i: i["change_pct"])
        more = f" (+{len(worst) - 3} more)" if len(worst) > 3 else ""
        return failed(f"{len(worst)} row(s) dropped > {o.threshold:g}%: " + "; ".join(map(describe, worst[:3])) + more, **res)
    return passed(f"{len(res['compared'])} row(s) within {o.threshold:g}% of {o.baseline}", **res)
