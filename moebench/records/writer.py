"""Writing records: JSONL appended one whole line at a time, flushed and fsynced as each backend or
case finishes, so an interrupted or crashed run keeps everything it finished.

The output may be a symlink (written through: the link stays, its target gets the records, made if it
does not exist yet) or a device that takes writes (/dev/stdout piped into jq, /dev/null): only a regular
file is fsynced, a device has no disk to sync. A write that fails (a full disk) is cli.OutputError, one
line naming the file: the records before it are kept, the tool stops."""
from __future__ import annotations

import json
import os

from ..cli import OutputError, real_path


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Append records, one JSON object a line (every tool's --out appends), and fsync: they are on disk
    when this returns."""
    p = real_path(path)
    try:
        if p.parent != p.parent.parent:
            p.parent.mkdir(parents=True, exist_ok=True)
        ensure_newline(p)              # a line cut short by a killed run stays its own (skipped) line
        with p.open("a") as f:
            for r in records:
                f.write(json.dumps(r, default=str) + "\n")   # one write per whole line, flushed
                f.flush()
            if p.is_file():
                os.fsync(f.fileno())
    except OSError as e:
        raise OutputError(f"{path}: cannot append {len(records)} record(s) ({e.strerror or type(e).__name__}); "
                          "the records written before these are kept") from None


def ensure_newline(path: str | os.PathLike) -> None:
    """End a non-empty file with a newline, so the next record starts a line of its own."""
    p = real_path(path)
    if p.is_file() and p.stat().st_size:
        with p.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            with p.open("a") as f:
                f.write("\n")
