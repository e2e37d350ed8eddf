"""What every `python -m moebench.<tool>` shares at its edges: the entry point (SIGTERM is handled
like SIGINT, and either ends the tool with one line, never a KeyboardInterrupt traceback)."""
from __future__ import annotations

import signal
import sys

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
