"""Machine-readable output of a check run: one JSON object, and JUnit XML for CI.

JSON: {schema, argv, repro, env (provenance), start_utc, end_utc, counts, results: [{key, status,
summary, details, seconds}]}. JUnit: one <testcase> per check; WAIVED is <skipped>, FAIL <failure>.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ..cli import OutputError, real_path
from ..records import provenance as _results
from ..records.check import SCHEMA, CheckReport  # noqa: F401  (SCHEMA: what readers of a report match)
from .registry import FAIL, STATUSES, WAIVED, Result


def counts(res: list[Result]) -> dict:
    return {s: sum(1 for r in res if r.status == s) for s in STATUSES}


def to_json(res: list[Result], argv: list[str], start_utc: str, end_utc: str) -> dict:
    return CheckReport(argv, _results.repro_command(argv, "moebench.check"), _results.provenance(), start_utc,
                       end_utc, counts(res), [r.asdict() for r in res]).asdict()


def to_junit(res: list[Result], name: str = "moebench.check") -> ET.ElementTree:
    c = counts(res)
    suite = ET.Element("testsuite", name=name, tests=str(len(res)), failures=str(c[FAIL]), errors="0",
                       skipped=str(c[WAIVED]), time=f"{sum(r.seconds for r in res):.3f}")
    for r in res:
        case = ET.SubElement(suite, "testcase", classname=name, name=r.key, time=f"{r.seconds:.3f}")
        if r.status == FAIL:
            ET.SubElement(case, "failure", message=r.summary).text = json.dumps(r.details, indent=1, default=str)
        elif r.status == WAIVED:
            ET.SubElement(case, "skipped", message=r.summary)
        ET.SubElement(case, "system-out").text = r.summary
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.ElementTree(root)


def write_json(path: str | Path, doc: dict) -> None:
    _write(path, lambda p: p.write_text(json.dumps(doc, indent=1, default=str) + "\n"))


def write_junit(path: str | Path, res: list[Result]) -> None:
    tree = to_junit(res)
    ET.indent(tree)
    _write(path, lambda p: tree.write(p, encoding="utf-8", xml_declaration=True))


def _write(path, write) -> None:
    """write(p) into PATH, its folders made (a symlink is written through); a failure is one line (OutputError)."""
    p = real_path(path)
    try:
        if p.parent != p.parent.parent:
            p.parent.mkdir(parents=True, exist_ok=True)
        write(p)
    except OSError as e:
        raise OutputError(f"{path}: cannot write the report ({e.strerror or type(e).__name__})") from None
