"""What every `python -m moebench.<tool>` shares at its edges: the entry point (SIGTERM is handled
like SIGINT, and either ends the tool with one line, never a KeyboardInterrupt traceback) and
output paths checked before any work."""
from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

INTERRUPTED = 130          # the shell's code for a process ended by SIGINT


def _as_interrupt(signum, frame):
    raise KeyboardInterrupt


def run(main, prog: str, argv: list[str] | None = None) -> int:
    """main(argv) with SIGTERM turned into KeyboardInterrupt; an interrupt prints one line and
    returns 130 (rank processes are ended by the launcher's cleanup on the way out)."""
    signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        return main(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED


def output_problem(path: str | None, flag: str) -> str:
    """'' when the tool can write PATH at the end of its run (appended or replaced, parent folders
    made as the writers make them); else one line naming the flag. Checked before any work, so a
    bad path never costs a run's results. Nothing in an existing file is changed."""
    if not path:
        return ""
    p = Path(path)
    if p.is_dir():
        return f"{flag} {path}: is a directory"
    anc = p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        return f"{flag} {path}: {anc} is not a directory"
    try:
        if anc == p.parent:
            existed = p.exists()
            with p.open("a"):
                pass
            if not existed:
                p.unlink()
        else:
            with tempfile.TemporaryFile(dir=anc):
                pass
    except OSError as e:
        return f"{flag} {path}: cannot write there ({e.strerror or type(e).__name__})"
    return ""


def first_output_problem(pairs) -> str:
    """The first problem of several (path, flag) outputs, or ''."""
    return next((m for m in (output_problem(p, f) for p, f in pairs) if m), "")
