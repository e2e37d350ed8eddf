"""Where a rank's native libraries write while moebench listens (backends/nccl_family.native_output), so that
their own last lines reach the FAIL row even when they end the process.

NCCL EP stops on misuse with a C `assert` (SIGABRT) and DeepEP V2 reports a failed kernel compile through C
stdio before it throws: that text is what names the cause. The spawning parent names a file per rank in the
environment (NATIVE_LOG_ENV); native_output writes fds 1 and 2 there while a native call runs (emptied again
once the call returned and its text was passed on), and a rank that died by a signal is reported with the
file's last lines (harness/launch.py).
"""
from __future__ import annotations

import os

NATIVE_LOG_ENV = "MOEBENCH_NATIVE_LOG"
TAIL_LINES = 12


def tail(text: str, n: int = TAIL_LINES) -> str:
    """'; its last lines: a | b | c' of the non-blank lines of `text`, '' when there are none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-n:]
    return f"; its last lines: {' | '.join(lines)}" if lines else ""


def tail_of(path: str) -> str:
    """tail() of a file a rank left behind ('' when it has none)."""
    try:
        with open(path, errors="replace") as f:
            return tail(f.read())
    except OSError:
        return ""
