"""Bad input is one line on stderr and exit 2: `Parser` (an argparse parser whose errors are one line) and
the argument types below, which range-check every value as it is parsed."""
from __future__ import annotations

import argparse
import math
import re
import sys

from .edges import EXIT_USAGE, error

SEED_MAX = 2**63 - 1                         # torch.Generator.manual_seed takes int64
MAX_WAIT_S = 1e9       # ~31 years: every clock a wait goes through holds it (Python's in int64 ns: ~292 years)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `prog: error: message` on stderr, exit 2, no usage dump; a value that is
    an empty string (`--sweep ''`, an unset shell variable) names nothing and is refused, whatever the flag:
    read as false, it would run something else than the user asked for without a word."""

    def error(self, message):
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)     # "--iters must be >= 1, got 0"
        error(self.prog.removeprefix("python -m "), message)
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        for a in _actions(self):
            v = getattr(ns, a.dest, None)
            if (v == "" or (isinstance(v, list) and "" in v)) and v != a.default and not getattr(a, "own_empty", False):
                name = a.option_strings[0] if a.option_strings else a.metavar or a.dest
                self.error(f"{name} is empty: give it a value" + (", or leave it out" if a.option_strings else ""))
        return ns, rest


def own_empty(action: argparse.Action) -> argparse.Action:
    """Mark a flag whose tool refuses an empty value itself, in its own words (a comma list that "names no
    op"): the parser leaves it to the tool."""
    action.own_empty = True
    return action


def _actions(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions and those of its subcommands' parsers."""
    out = []
    for a in p._actions:
        out.append(a)
        if isinstance(a, argparse._SubParsersAction):
            out += [b for sub in dict.fromkeys(a.choices.values()) for b in _actions(sub)]
    return out


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
