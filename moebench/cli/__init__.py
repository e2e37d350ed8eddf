"""What every `python -m moebench.<tool>` shares at its edges.

- Bad input is one line on stderr and exit 2: `Parser` (an argparse parser whose errors are one
  line) and the argument types below, which range-check every value as it is parsed.
- Output paths are checked before any work (`output_problem`, cli/paths.py): an empty path, a directory, a path
  under a file, an unwritable place, a FIFO or a full device is refused; missing folders are made, by
  the check and by every writer alike; two flags naming one file are refused.
- Interrupts: SIGINT and SIGTERM end the tool with one line on stderr and exit 130 / 143 (128 + the
  signal), never a traceback, also while it still imports (`interrupts_at_start`); rank processes die
  on the same signals without printing (harness/launch.py), and what a tool finished stays.
- A closed stdout (`... | head -1`) never aborts the work: output to the closed pipe is dropped,
  records are still written, and the tool exits quietly with 141, the status of a process ended by
  SIGPIPE. A stdout closed (`>&-`) or unwritable (`>/dev/full`) at the start is bad usage (exit 2);
  one that fails later drops the rest of the output, not the work (one line, exit 1).
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import re
import signal
import sys

from .paths import first_output_problem, held_open, output_problem, real_path, repeated_input  # noqa: F401

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE     # 141
SEED_MAX = 2**63 - 1                         # torch.Generator.manual_seed takes int64
MAX_WAIT_S = 1e9       # ~31 years: every clock a wait goes through holds it (Python's in int64 ns: ~292 years)
TOOLS = ("moebench", "moebench.dispatch", "moebench.permute", "moebench.check", "moebench.report", "moebench.plan",
         "moebench.megatron")


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
    except OSError as e:
        if e.errno != errno.EPIPE:
            return f"stdout cannot be written ({e.strerror}): send it somewhere that takes it (>/dev/null drops it)"
    except (AttributeError, ValueError):         # a stream without a descriptor (a test's capture)
        pass
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
        print(f"{prog}: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        rc = main(argv)
    except KeyboardInterrupt as e:
        for stop in (signal.SIGINT, signal.SIGTERM):   # exiting: a second signal (timeout(1) sends two) is moot
            signal.signal(stop, signal.SIG_IGN)
        signum = getattr(e, "signum", signal.SIGINT)
        detail = getattr(e, "detail", "")
        print(f"{prog}: interrupted by {signal.Signals(signum).name}" + (f"; {detail}" if detail else ""),
              file=sys.stderr)
        return 128 + signum
    except OutputError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    out.flush()
    if out.failed:
        print(f"{prog}: error: stdout failed ({out.failed}): the output after that was dropped, not the work",
              file=sys.stderr)
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


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `prog: error: message` on stderr, exit 2, no usage dump."""

    def error(self, message):
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)     # "--iters must be >= 1, got 0"
        print(f"{self.prog.removeprefix('python -m ')}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


MAX_ITERS = 100_000              # timed iterations: every sample lands in the record
MAX_CALLS = 1_000_000            # checked calls of a soak: < 3e-6 at 95% when none fails


def count(low: int = 1, high: int | None = None, why: str = ""):
    """argparse type: an integer >= low (and <= high, `why` saying what the bound is for)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}{f' ({why})' if why else ''}, got {v}")
        return v
    parse.__name__ = f"integer >= {low}"
    return parse


def number(low: float = 0.0, strict: bool = False, high: float | None = None):
    """argparse type: a finite number > low (strict) or >= low, and < high when given."""
    want = f"{'>' if strict else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {want}, got {text!r}") from None
        if not math.isfinite(v) or v < low or (strict and v == low) or (high is not None and v >= high):
            raise argparse.ArgumentTypeError(f"must be a finite number {want}, got {text}")
        return v
    parse.__name__ = f"number {want}"
    return parse


def seconds(text: str) -> float:
    """argparse type of a timeout: seconds > 0 that every clock a wait goes through can hold (MAX_WAIT_S)."""
    if number(0, strict=True)(text) > MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_WAIT_S:g} s (~31 years: longer no clock here holds), "
                                         f"got {text}")
    return float(text)


def seed(text: str) -> int:
    """argparse type: a seed torch takes (0 <= seed <= 2^63 - 1)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2^63 - 1], got {text!r}") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^63 - 1] (torch's seed range), got {v}")
    return v


def comma_list(text: str, flag: str, what: str = "name") -> list[str]:
    """The items of a comma list, stripped; ValueError (one line, starting with `flag` unless it is '') for
    none, an empty one or one given twice."""
    head, items = f"{flag} " if flag else "", [s.strip() for s in text.split(",")]
    if not any(items):
        raise ValueError(f"{head}names no {what}")
    if not all(items):
        raise ValueError(f"{head}{text!r} has an empty {what} between its commas")
    twice = next((s for i, s in enumerate(items) if s in items[:i]), None)
    if twice:
        raise ValueError(f"{head}names {twice} twice")
    return items


def text_to_stderr(*paths) -> None:
    """When an output is this process's stdout and no terminal (`--out /dev/stdout | jq`), the tables and notes
    go to stderr, so that the pipe carries the records alone."""
    try:
        if isinstance(sys.stdout, _Stdout) and not os.isatty(1) and any(p and held_open(os.stat(p), (1,))
                                                                         for p in paths):
            sys.stdout._s = sys.stderr
    except OSError:
        pass


# ---- settings declared once: a dataclass field is its flag ------------------------------------------
def setting(value=None, flag: str | None = None, *, help: str = "", read=None, write=None, extra=(), **argparse_kw):
    """A dataclass field (default `value`) that is a command-line flag: its argparse options (`default`
    there is the flag's, else `value`), how the parsed flags give the field's value (`read(args, ctx)`;
    default: the flag's own value) and how the field goes back into a command line (`write(value) ->
    tokens`; default: `flag value` unless it is the field's default, `flag` for a switch). `extra`: more
    (flag, argparse options) pairs that feed the same field. A new flag is one such field (and the code
    that reads it)."""
    from dataclasses import field
    if flag and "default" not in argparse_kw and argparse_kw.get("action") not in ("store_true", "append"):
        argparse_kw["default"] = value
    meta = {"flag": flag, "help": help, "argparse": argparse_kw, "read": read, "write": write, "extra": tuple(extra)}
    if isinstance(value, (dict, list, set)):
        return field(default_factory=lambda: type(value)(value), metadata=meta)
    return field(default=value, metadata=meta)


def add_settings(p: argparse.ArgumentParser, cls) -> None:
    """Every flag declared by `cls`'s fields (in field order)."""
    import dataclasses
    for f in dataclasses.fields(cls):
        m = f.metadata
        if m.get("flag"):
            p.add_argument(m["flag"], help=m["help"], **m["argparse"])
        for flag, kw in m.get("extra", ()):
            p.add_argument(flag, **kw)


def read_settings(cls, args, ctx: dict | None = None, skip: tuple[str, ...] = ()) -> dict:
    """{field: value} of `cls`'s flag fields from parsed `args` (each field's `read`, else the flag's value)."""
    import dataclasses
    out = {}
    for f in dataclasses.fields(cls):
        m = f.metadata
        if f.name in skip or not (m.get("flag") or m.get("read")):
            continue
        out[f.name] = m["read"](args, ctx or {}) if m.get("read") else getattr(args, _dest(m["flag"]))
    return out


def write_settings(obj) -> list[str]:
    """The command-line tokens that give back `obj`'s flag fields."""
    import dataclasses
    argv: list = []
    for f in dataclasses.fields(obj):
        m, v = f.metadata, getattr(obj, f.name)
        if m.get("write"):
            argv += m["write"](v)
        elif m.get("flag"):
            if m["argparse"].get("action") == "store_true":
                argv += [m["flag"]] if v else []
            elif v is not None and v != f.default:
                argv += [m["flag"], v]
    return [str(a) for a in argv]


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
