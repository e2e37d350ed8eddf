"""The process edges every `python -m moebench.<tool>` shares: exit codes, interrupts and stdout.

- Interrupts: SIGINT and SIGTERM end the tool with one line on stderr and exit 130 / 143 (128 + the
  signal), never a traceback, also while it still imports (`interrupts_at_start`); rank processes die
  on the same signals without printing (harness/launch.py), and what a tool finished stays.
- A closed stdout (`... | head -1`) never aborts the work: output to the closed pipe is dropped,
  records are still written, and the tool exits quietly with 141, the status of a process ended by
  SIGPIPE. A stdout closed (`>&-`) or unwritable (`>/dev/full`) at the start is bad usage (exit 2);
  one that fails later drops the rest of the output, not the work (one line, exit 1).
"""
from __future__ import annotations

import errno
import io
import os
import re
import signal
import sys

from .paths import held_open

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE     # 141
TOOLS = ("moebench", "moebench.dispatch", "moebench.permute", "moebench.check", "moebench.report", "moebench.plan",
         "moebench.megatron")
_BREAKS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text) -> str:
    """`text` with every control character written as its escape (`\\n`), so that a message naming a path that
    holds a newline is still one line."""
    return _BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode(), str(text))


def error(prog: str, message) -> None:
    """The one line of a tool's error on stderr: `prog: error: message`."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)


class OutputError(Exception):
    """An output that could not be written after the run started (a full disk): one line, exit 1."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM; `detail` says what was kept and what did not run."""

    def __init__(self, signum: int = signal.SIGINT, detail: str = ""):
        super().__init__(signum)
        self.signum, self.detail = signum, detail

    @classmethod
    def after(cls, e: KeyboardInterrupt, detail: str) -> Interrupted:
        """The interrupt `e` (Ctrl-C, or SIGTERM raised as Interrupted) with what a tool kept and left undone."""
        return cls(getattr(e, "signum", signal.SIGINT), detail)


def _on_sigterm(signum, frame):
    raise Interrupted(signum)


def _started(signum, frame):
    """A stop signal while a tool is still importing: nothing ran, nothing to keep, no ranks yet."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    prog = getattr(main, "name", "moebench").removesuffix(".__main__")
    os.write(2, f"{prog}: interrupted by {signal.Signals(signum).name} while starting; nothing ran\n".encode())
    os._exit(128 + signum)


def interrupts_at_start() -> None:
    """When `python -m` starts one of the TOOLS: SIGINT and SIGTERM end it with one line until cli.run takes
    over (not a traceback from inside torch's import). A SIGINT ignored by the shell (`tool &`) stays so."""
    argv = getattr(sys, "orig_argv", [])
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if module not in TOOLS:
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) not in (signal.SIG_IGN, None):
            signal.signal(s, _started)


class _Stdout:
    """stdout that survives its reader going away: on EPIPE the rest of the output goes to /dev/null
    (the file descriptor too, so child processes started later inherit /dev/null) and `broken` is set;
    any other failure (a full disk) does the same and keeps its reason in `failed`."""

    def __init__(self, stream):
        self._s, self.broken, self.failed = stream, False, ""

    def _drop(self):
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._s.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def _unless_gone(self, op, *args) -> None:
        """op(*args) while the reader is there; EPIPE (it went away) drops this and all later output."""
        if self.broken:
            return
        try:
            op(*args)
        except OSError as e:
            if not (isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE):
                self.failed = e.strerror or type(e).__name__
            self._drop()

    def write(self, text):
        self._unless_gone(self._s.write, text)
        return len(text)

    def flush(self):
        self._unless_gone(self._s.flush)

    def __getattr__(self, name):
        return getattr(self._s, name)


def stdout_problem() -> str:
    """'' when stdout can be written (or its reader already left: 141 at the end); else one line."""
    if sys.stdout is None:
        return "stdout is closed (>&-): give it somewhere to go (>/dev/null drops it; records still go to files)"
    try:
        os.write(sys.stdout.fileno(), b"")       # writes nothing, fails as a write would: /dev/full, a bad fd
    except (io.UnsupportedOperation, AttributeError, ValueError):    # a stream without a descriptor (a capture)
        pass
    except OSError as e:
        if e.errno != errno.EPIPE:
            return f"stdout cannot be written ({e.strerror}): send it somewhere that takes it (>/dev/null drops it)"
    return ""


def run(main, prog: str, argv: list[str] | None = None) -> int:
    """main(argv) with the edges above: SIGTERM raised like SIGINT, one line and 130 / 143 on an
    interrupt, 141 (quietly) when stdout was closed under it, 2 when it is unusable from the start, one
    line and 1 when it or an output file failed later."""
    if signal.getsignal(signal.SIGINT) is _started:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    bad = stdout_problem()
    if bad:
        error(prog, bad)
        return EXIT_USAGE
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        rc = main(argv)
    except KeyboardInterrupt as e:
        for stop in (signal.SIGINT, signal.SIGTERM):   # exiting: a second signal (timeout(1) sends two) is moot
            signal.signal(stop, signal.SIG_IGN)
        signum = getattr(e, "signum", signal.SIGINT)
        detail = getattr(e, "detail", "")
        print(f"{prog}: interrupted by {signal.Signals(signum).name}" + (f"; {one_line(detail)}" if detail else ""),
              file=sys.stderr)
        return 128 + signum
    except OutputError as e:
        error(prog, e)
        return 1
    out.flush()
    if out.failed:
        error(prog, f"stdout failed ({out.failed}): the output after that was dropped, not the work")
        return rc or 1
    return EXIT_BROKEN_PIPE if out.broken else rc


def tool(main):
    """A tool's main(argv) -> int: a usage error (and --help) returns its exit code instead of raising
    SystemExit, so main() called from Python gives the same code as the command line."""
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    wrapped.__name__, wrapped.__doc__, wrapped.__wrapped__ = main.__name__, main.__doc__, main
    return wrapped


def text_to_stderr(*paths) -> None:
    """When an output is this process's stdout and no terminal (`--out /dev/stdout | jq`), the tables and notes
    go to stderr, so that the pipe carries the records alone."""
    try:
        if isinstance(sys.stdout, _Stdout) and not os.isatty(1) and any(p and held_open(os.stat(p), (1,))
                                                                         for p in paths):
            sys.stdout._s = sys.stderr
    except OSError:
        pass
