"""Bad input is one line on stderr and exit 2: `Parser` (an argparse parser whose errors are one line) and
the argument types below, which range-check every value as it is parsed."""
from __future__ import annotations

import argparse
import math
import re
import sys

from .edges import EXIT_USAGE

SEED_MAX = 2**63 - 1                         # torch.Generator.manual_seed takes int64
MAX_WAIT_S = 1e9       # ~31 years: every clock a wait goes through holds it (Python's in int64 ns: ~292 years)


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
