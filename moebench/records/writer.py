"""Writing records: JSONL appended one whole line at a time, flushed and fsynced as each backend or
case finishes, so an interrupted or crashed run keeps everything it finished."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Append records, one JSON object a line (every tool's --out appends), and fsync: they are on disk
    when this returns."""
    p = Path(path)
    if p.parent != Path(""):
        p.parent.mkdir(parents=True, exist_ok=True)
    ensure_newline(p)                  # a line cut short by a killed run stays its own (skipped) line
    with p.open("a") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")   # one write per whole line, flushed
            f.flush()
        os.fsync(f.fileno())


def ensure_newline(path: str | os.PathLike) -> None:
    """End a non-empty file with a newline, so the next record starts a line of its own."""
    p = Path(path)
    if p.is_file() and p.stat().st_size:
        with p.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            with p.open("a") as f:
                f.write("\n")
