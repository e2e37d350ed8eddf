"""Crash-contained child processes: every probe of a backend (or of any native library that may
segfault, abort or hang) runs here, never in the process that prints the report.

A child is started in its own session, so on timeout the whole process group (the child and any
rank processes it spawned) is killed. Its result comes back as one marker line of JSON on stdout;
a signal, a non-zero exit or a timeout comes back as a `ChildResult` whose `failure()` line names
the signal and quotes the last lines of stderr, which the check turns into a FAIL row.

    python -m moebench.checks.child MODULE:FUNCTION '{"kwarg": 1}'
runs FUNCTION(**kwargs) and prints its JSON-able return value after the marker.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any

from ..env.toolkit import PACKAGE_DIR

MARKER = "@@moebench-child-result@@ "
REPO_ROOT = PACKAGE_DIR.parent    # the folder that holds the moebench package (PYTHONPATH of a child)
TAIL_LINES = 12


@dataclass
class ChildResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    stdout: str = ""
    stderr: str = ""
    value: Any = None
    has_value: bool = False
    argv: list[str] = field(default_factory=list)

    @property
    def signal(self) -> str | None:
        """Name of the signal that killed the child (SIGSEGV, SIGABRT, ...), else None."""
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.has_value

    def stderr_tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.stderr.rstrip().splitlines()[-lines:])

    def failure(self) -> str:
        """One line: how the child ended, plus the last stderr line; '' when it succeeded."""
        if self.ok:
            return ""
        if self.timed_out:
            how = f"timed out after {self.seconds:.0f} s (killed)"
        elif self.signal:
            how = f"killed by {self.signal}"
        elif self.returncode != 0:
            how = f"exited with code {self.returncode}"
        else:
            how = "exited without a result"
        hint = error_line(self.stderr)
        return f"{how}" + (f"; {hint[:300]}" if hint else "")


NOISE = ("Extension modules:", "(total:", "Current thread", "Thread 0x", "Fatal Python error: Aborted",
         "warnings.warn(", "Warning:", "UserWarning")
ERROR_WORDS = ("error", "Error", "abort", "Assertion", "assert", "not supported", "failed", "Segmentation")


def error_line(stderr: str) -> str:
    """The line of a crashed child's stderr that says what went wrong, for a one-line hint.

    A native crash under faulthandler ends with its list of extension modules, which says nothing:
    prefer a line a library printed before dying (a CUDA error, an assertion, HybridEP's
    "Inter-node communication is not supported"), else the innermost Python frame of the crashed
    thread outside the standard library ("File ..., line N in f"), else the last line that is not faulthandler boilerplate."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    fatal = next((i for i, l in enumerate(lines) if l.startswith("Fatal Python error")), None)
    before = lines[:fatal] if fatal is not None else lines
    said = [l for l in before if any(w in l for w in ERROR_WORDS) and not l.startswith(NOISE)
            and not l.startswith("File ") and "Fatal Python error" not in l]
    if said:
        return said[-1]
    if fatal is not None:
        tail = lines[fatal:]   # the crashed thread's frames follow "Current thread", other threads' precede it
        cur = next((i for i, l in enumerate(tail) if l.startswith("Current thread")), 0)
        frames = [l for l in tail[cur:] if l.startswith("File ")]
        stdlib = f'File "{sysconfig.get_paths()["stdlib"]}/'
        frame = next((l for l in frames if not l.startswith(stdlib) or "site-packages" in l), frames[0] if frames else "")
        where = f" at {frame.removeprefix('File ')}" if frame else ""
        return lines[fatal].removeprefix("Fatal Python error: ") + where
    rest = [l for l in lines if not l.startswith(NOISE)]
    return f"stderr: {rest[-1]}" if rest else ""


def _env(extra: dict | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_argv(argv: list[str], timeout_s: float, env: dict | None = None, cwd=None) -> ChildResult:
    """Run argv in a new session; kill its process group on timeout (and any leftovers after)."""
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace", env=_env(env), cwd=cwd or REPO_ROOT, start_new_session=True)
    except OSError as e:
        return ChildResult(None, False, 0.0, "", f"{type(e).__name__}: {e}", argv=argv)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(p.pid)
        out, err = p.communicate()
    except BaseException:       # SIGINT / SIGTERM of the tool: the child's own session does not get it
        _kill_group(p.pid)
        p.communicate()
        raise
    _kill_group(p.pid)          # rank processes left behind by a crashed parent
    res = ChildResult(p.returncode, timed_out, time.monotonic() - t0, out, err, argv=argv)
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            try:
                res.value, res.has_value = json.loads(line[len(MARKER):]), True
            except json.JSONDecodeError:
                pass
            break
    return res


def python_argv(*args: str) -> list[str]:
    return [sys.executable, "-X", "faulthandler", *args]


def run_code(code: str, timeout_s: float, env: dict | None = None) -> ChildResult:
    """Run a snippet of Python in a child; it reports a value with `emit(value)`."""
    return run_argv(python_argv("-c", code), timeout_s, env)


def run_function(target: str, kwargs: dict | None = None, timeout_s: float = 300.0,
                 env: dict | None = None) -> ChildResult:
    """Run MODULE:FUNCTION(**kwargs) in a child; its return value comes back as `.value`."""
    return run_argv(python_argv("-m", "moebench.checks.child", target, json.dumps(kwargs or {})),
                    timeout_s, env)


def emit(value: Any) -> None:
    """Report the child's result to the parent (last marker line wins)."""
    sys.stdout.write(MARKER + json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or ":" not in args[0]:
        print("usage: python -m moebench.checks.child MODULE:FUNCTION [JSON-KWARGS]", file=sys.stderr)
        return 2
    module, func = args[0].split(":", 1)
    kwargs = json.loads(args[1]) if len(args) == 2 else {}
    emit(getattr(importlib.import_module(module), func)(**kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
