"""What every `python -m moebench.<tool>` shares at its edges.

- Bad input is one line on stderr and exit 2: `Parser` (an argparse parser whose errors are one
  line) and the argument types below, which range-check every value as it is parsed.
- Output paths are checked before any work (`output_problem`): an empty path, a directory, a path
  under a file or an unwritable place is refused; missing folders are made, by the check and by
  every writer alike.
- Interrupts: SIGINT and SIGTERM end the tool with one line on stderr and exit 130 / 143 (128 +
  the signal), never a traceback; rank processes die on the same signals without printing
  (harness/launch.py), and what a tool has finished (records written as each backend ends) stays.
- A closed stdout (`... | head -1`) never aborts the work: output to the closed pipe is dropped,
  records are still written, and the tool exits quietly with 141, the status of a process ended by
  SIGPIPE (the usual convention for a writer whose reader went away).
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE     # 141
SEED_MAX = 2**63 - 1                         # torch.Generator.manual_seed takes int64


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


class _Stdout:
    """stdout that survives its reader going away: on EPIPE the rest of the output goes to /dev/null
    (the file descriptor too, so child processes started later inherit /dev/null) and `broken` is set."""

    def __init__(self, stream):
        self._s, self.broken = stream, False

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
                raise
            self._drop()

    def write(self, text):
        self._unless_gone(self._s.write, text)
        return len(text)

    def flush(self):
        self._unless_gone(self._s.flush)

    def __getattr__(self, name):
        return getattr(self._s, name)


def run(main, prog: str, argv: list[str] | None = None) -> int:
    """main(argv) with the edges above: SIGTERM raised like SIGINT, one line and 130 / 143 on an
    interrupt, 141 (quietly) when stdout was closed under it."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        rc = main(argv)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        detail = getattr(e, "detail", "")
        print(f"{prog}: interrupted by {signal.Signals(signum).name}" + (f"; {detail}" if detail else ""),
              file=sys.stderr)
        return 128 + signum
    out.flush()
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


def count(low: int = 1):
    """argparse type: an integer >= low."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
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


def seed(text: str) -> int:
    """argparse type: a seed torch takes (0 <= seed <= 2^63 - 1)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2^63 - 1], got {text!r}") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^63 - 1] (torch's seed range), got {v}")
    return v


def output_problem(path: str | None, flag: str, folder: bool = False) -> str:
    """'' when the tool can write PATH (a file, or with `folder` a directory) at the end of its run,
    made with its missing parent folders; else one line naming the flag. Checked before any work, so
    a bad path never costs a run's results. Nothing in an existing file is changed."""
    if path is None:
        return ""
    if not path.strip():
        return f"{flag}: empty path"
    p = Path(path)
    if folder:
        if p.exists() and not p.is_dir():
            return f"{flag} {path}: exists and is not a directory"
    elif p.is_dir():
        return f"{flag} {path}: is a directory"
    anc = p if folder else p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        return f"{flag} {path}: {anc} is not a directory"
    try:
        if not folder and anc == p.parent:
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
