"""Reading records back: the one reader of every offline input (report FILE and --compare, plan --results,
check --baseline, megatron flags / validate --results and compare, the resume of a sweep's --out, sweep
files). Whatever a file holds, it raises nothing but RecordError: one line naming the file, and the line
where one line is to blame.

- A file that cannot be one is refused whole: missing, a directory, a FIFO or a device (reading a FIFO
  blocks until something writes it), unreadable, UTF-16 text.
- A line that cannot be read as a record (not UTF-8, not JSON, nested too deep, a number too long to read,
  a JSON value that is not an object, a record of the wrong shape: records/validate.py) is skipped and
  counted in one line on stderr when the rest is usable, and refused when nothing usable is left.
- A record whose figures are impossible (NaN, infinite, 0 or negative times and bandwidths) is skipped
  the same way, except by the tools that judge (verdict=True), which refuse it, and refuse a line they
  cannot read alike, naming the first: a verdict drawn from what is left of a damaged A/B is a verdict on
  another A/B than the one the user ran.
A UTF-8 byte order mark at the start of a file is read past. A file that is one JSON document over several
lines (a check --out report) reads as one record on line 1.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..cli import one_line
from . import validate
from .validate import WORKLOAD_KEYS

MAX_DEPTH = 64                     # records nest a few levels; deeper is no record (and breaks json.dumps later)
BOM = b"\xef\xbb\xbf"
KIND_NAMES = {"dispatch": "moebench.dispatch record", "row": "bandwidth row", "check": "moebench.check report",
              "permute": "moebench.permute record", "check-no-rows": "moebench.check report| with no bandwidth rows"}
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


class RecordError(ValueError):
    """An input no tool can use: one line on stderr, exit 2."""


class Unreadable(ValueError):
    """Text that is not one JSON value a record can be (the reason, without the place)."""


@dataclass(frozen=True)
class Bad:
    """A line skipped or refused: where, and why."""
    path: str
    line: int
    why: str
    figure: bool = False           # an impossible figure in a record of the right shape

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


# ---- files and JSON --------------------------------------------------------------------------------

def _not_a_file(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def file_bytes(path) -> bytes:
    """The bytes of a regular file (a UTF-8 byte order mark dropped); RecordError naming what is wrong."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise RecordError(f"{p}: no such file" + (" (a symbolic link to a missing file)" if os.path.islink(p)
                                                  else "")) from None
    except (OSError, ValueError) as e:
        raise RecordError(f"{p}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise RecordError(f"{p}: is {_not_a_file(st.st_mode)}, not a regular file")
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise RecordError(f"{p}: cannot read it ({e.strerror or e})") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise RecordError(f"{p}: UTF-16 text, not UTF-8 (save it as UTF-8)")
    return raw.removeprefix(BOM)


def _depth(v) -> int:
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                break
            stack += [(y, d + 1) for y in (x.values() if isinstance(x, dict) else x)]
    return deepest


def parse(text: str):
    """One JSON value, or Unreadable saying why not (never RecursionError or a bare ValueError)."""
    try:
        v = json.loads(text)
    except RecursionError:
        raise Unreadable("nested too deeply to read") from None
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":       # JSON, but more than one value: JSON lines where one document belongs
            raise Unreadable(f"more than one JSON value (the second at line {e.lineno}, column {e.colno})") from None
        msg = e.msg.lower().removesuffix(" at")       # "Invalid control character at"
        raise Unreadable(f"not JSON: {msg} at column {e.colno}") from None
    except ValueError as e:        # an integer of more digits than Python converts (4300)
        raise Unreadable("a number too long to read" if "digits" in str(e) else f"not JSON: {e}") from None
    if _depth(v) > MAX_DEPTH:
        raise Unreadable(f"nested deeper than {MAX_DEPTH} levels: no record is")
    if _SURROGATE.search(text):
        try:
            json.dumps(v, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise Unreadable("a string holds a lone UTF-16 surrogate, not text") from None
    return v


def values(path) -> tuple[list[tuple[int, object]], list[Bad]]:
    """([(line, JSON value)], [lines that are no JSON value]) of a JSONL file, or of a file that is one
    JSON document (on line 1)."""
    raw, p = file_bytes(path), os.fspath(path)
    lines = [(n, chunk) for n, chunk in enumerate(raw.split(b"\n"), 1) if chunk.strip()]
    if len(lines) > 1 and raw.lstrip()[:1] in (b"{", b"["):
        try:
            return [(lines[0][0], parse(raw.decode()))], []
        except (UnicodeDecodeError, Unreadable):
            pass                   # JSON lines (or damage the lines below name)
    out, bad = [], []
    for n, chunk in lines:
        try:
            out.append((n, parse(chunk.decode())))
        except UnicodeDecodeError as e:
            bad.append(Bad(p, n, f"not UTF-8 text at byte {e.start + 1}"))
        except Unreadable as e:
            bad.append(Bad(p, n, str(e)))
    return out, bad


def load_document(path):
    """The one document of a settings file: TOML for a .toml name, else JSON; RecordError naming the file
    (and the line) when it is not one."""
    raw, p = file_bytes(path), os.fspath(path)
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise RecordError(f"{p}:{line}: not UTF-8 text") from None
    if Path(p).suffix != ".toml":
        try:
            return parse(text)
        except Unreadable as e:
            lines = "; it is one JSON document, not JSON lines" if str(e).startswith("more than one") else ""
            raise RecordError(f"{p}: {e}{lines}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RecordError(f"{p}: not TOML: {e}") from None
    except RecursionError:
        raise RecordError(f"{p}: nested too deeply to read") from None
    except ValueError as e:
        raise RecordError(f"{p}: a number too long to read" if "digits" in str(e) else f"{p}: not TOML: {e}") from None
    if _depth(doc) > MAX_DEPTH:
        raise RecordError(f"{p}: nested deeper than {MAX_DEPTH} levels")
    return doc


# ---- records ---------------------------------------------------------------------------------------

def _problem(obj, k: str, need) -> validate.Problem | None:
    return validate.dispatch_problem(obj, need) if k == "dispatch" else validate.row_problem(obj)


def _records(path, kinds, need) -> tuple[list[dict], list[Bad], dict]:
    """(the usable records of `kinds`, tagged _file and _line; the bad ones; {kind: count} of the objects of
    other kinds). A check report gives its bandwidth rows."""
    p = os.fspath(path)
    found, bad = values(path)
    out, other = [], {}
    for n, obj in found:
        k = validate.kind(obj)
        if not isinstance(obj, dict):
            bad.append(Bad(p, n, f"{k}, not a record object"))
        elif k == "check" and "check" in kinds:
            rows, problems = validate.report_rows(obj)
            out += [{**row, "_file": p, "_line": n} for row in rows]
            bad += [Bad(p, n, q.why, q.figure) for q in problems]
            if not rows and not problems:
                other["check-no-rows"] = other.get("check-no-rows", 0) + 1
        elif k not in kinds:
            other[k] = other.get(k, 0) + 1
        elif q := _problem(obj, k, need):
            bad.append(Bad(p, n, q.why, q.figure))
        else:
            out.append({**obj, "_file": p, "_line": n})
    return out, sorted(bad, key=lambda b: b.line), other


def _nothing_usable(what: str, bad: list[Bad], other: dict) -> str:
    if bad:
        n = len(bad) - 1
        return f"no usable {what}: {bad[0]}" + (f" (and {n} more malformed line{'s' if n > 1 else ''})" if n else "")
    if other:
        held = ", ".join(_plural(KIND_NAMES.get(k, f"{k[:40]} record" if "/" in k else "object of no known kind"), n)
                         for k, n in other.items())
        return f"no {what} (it holds {held}, not {what})" if " or " not in what else f"no {what} (it holds only {held})"
    return f"no {what} (it is empty)"


def _plural(name: str, n: int) -> str:
    """'1 name' or 'n names' ('|' marks where the plural's s goes when not at the end)."""
    head, _, tail = name.partition("|")
    return f"{n} {head}{'' if n == 1 else 's'}{tail}"


def read(paths, tool: str | None, kinds=("dispatch",), need=WORKLOAD_KEYS, verdict: bool = False,
         require: bool = True) -> list[dict]:
    """The usable records of `kinds` in the files, in order, each tagged `_file` and `_line`.

    Arguments: tool: the name the note on stderr starts with (None: no note); need: the workload keys the
    tool reads; verdict: refuse a record with an impossible figure instead of skipping it; require: a
    file without any usable record is refused, saying what it holds.
    Raises RecordError (one line)."""
    names = [_plural(KIND_NAMES[k], 2).removeprefix("2 ") for k in kinds]
    what = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    out, skipped = [], []
    for path in paths:
        got, bad, other = _records(path, kinds, need)
        if verdict and any(b.figure for b in bad):
            raise RecordError(refusal([b for b in bad if b.figure]))
        if require and not got:
            raise RecordError(f"{os.fspath(path)}: {_nothing_usable(what, bad, other)}")
        if verdict and bad:
            raise RecordError(refusal(bad))
        out += got
        skipped += bad
    if skipped and tool:
        print(skip_note(tool, skipped), file=sys.stderr)
    return out


def read_dispatch(paths, tool: str | None, need=WORKLOAD_KEYS, verdict: bool = False,
                  require: bool = True) -> list[dict]:
    """The usable moebench.dispatch records of the files (read() with kinds=('dispatch',))."""
    return read(paths, tool, ("dispatch",), need, verdict, require)


def refusal(bad: list[Bad]) -> str:
    """The one line of a tool that judges, refusing a file with bad lines: the first, and how many."""
    first = bad[0]
    why = "an impossible figure" if first.figure else "a file with a line it cannot read"
    more = f" ({len(bad)} such lines)" if len(bad) > 1 else ""
    return f"{first}; refused: no verdict is drawn from {why}{more}"


def read_objects(path, tool: str | None = None, verdict: bool = False) -> list[dict]:
    """Every JSON object of a JSONL file, of any kind, tagged `_line` (lines that are none: skipped, counted;
    with verdict, RecordError naming the first)."""
    found, bad = values(path)
    bad += [Bad(os.fspath(path), n, f"{validate.show(v)}, not a record object")
            for n, v in found if not isinstance(v, dict)]
    bad.sort(key=lambda b: b.line)
    if bad and verdict:
        raise RecordError(refusal(bad))
    if bad and tool:
        print(skip_note(tool, bad), file=sys.stderr)
    return [{**v, "_line": n} for n, v in found if isinstance(v, dict)]


def holdings(objs: list[dict]) -> str:
    """What records of other kinds are: '2 moebench.dispatch records, 1 object of no known kind' ('nothing')."""
    counts: dict[str, int] = {}
    for o in objs:
        k = validate.kind(o)
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(_plural(KIND_NAMES.get(k, f"{k[:40]} record" if "/" in k else "object of no known kind"), n)
                     for k, n in counts.items()) or "nothing"


def skip_note(tool: str, bad: list[Bad], shown: int = 3) -> str:
    """One line: how many lines were skipped, the first few with why."""
    more = f"; +{len(bad) - shown} more" if len(bad) > shown else ""
    return one_line(f"# {tool}: skipped {len(bad)} malformed line{'s' if len(bad) > 1 else ''}: "
                    + "; ".join(f"{b.path}:{b.line} ({b.why})" for b in bad[:shown]) + more)
