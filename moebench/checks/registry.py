"""The check registry: every check has a key, a one-line description and a function.

Keys are `family` or `family.name` (`hybridep.build`): `-t KEY` selects one key or a whole family,
`-p PREFIX` every key starting with PREFIX. A check function takes the run's `Context` and returns
an `Outcome`; the runner times it and turns an exception into a FAIL row (the run goes on). Checks
that touch native code (backends, NCCL, NVSHMEM, the p2p probe) do so in child processes
(child.py), so a segfault, abort or hang is a FAIL row too, not the end of the run.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

PASS, FAIL, WAIVED = "PASS", "FAIL", "WAIVED"
STATUSES = (PASS, FAIL, WAIVED)


@dataclass
class Outcome:
    status: str
    summary: str
    details: dict = field(default_factory=dict)


def passed(summary: str, **details) -> Outcome:
    return Outcome(PASS, summary, details)


def failed(summary: str, **details) -> Outcome:
    return Outcome(FAIL, summary, details)


def waived(reason: str, **details) -> Outcome:
    return Outcome(WAIVED, reason, details)


@dataclass
class Result:
    key: str
    status: str
    summary: str
    details: dict
    seconds: float

    def asdict(self) -> dict:
        return asdict(self)

    @property
    def rows(self) -> list[dict]:
        """Bandwidth rows this check measured (see baseline.py for the row identity)."""
        return list(self.details.get("rows", []))


@dataclass
class Check:
    key: str
    description: str
    fn: Callable[["Context"], Outcome]
    optional: bool = False       # runs only when -t / -p names it (fault.*: each may wait out a watchdog)


@dataclass
class Context:
    """What a check may read: the parsed options, the results so far, a per-run cache."""
    options: Any
    results: list[Result] = field(default_factory=list)
    cache: dict = field(default_factory=dict)

    def cached(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]


REGISTRY: dict[str, Check] = {}


def register(key: str, description: str, optional: bool = False):
    """Decorator: add a check function to the registry under `key` (registration order = run order); an optional
    one runs only when -t or -p names it."""
    def wrap(fn):
        if key in REGISTRY:
            raise ValueError(f"check {key!r} registered twice")
        REGISTRY[key] = Check(key, description, fn, optional)
        return fn
    return wrap


class SelectionError(ValueError):
    """A -t/-p selection that names nothing: bad usage (exit 2)."""


def family(key: str) -> str:
    return key.split(".", 1)[0]


def select(keys: list[str] | None = None, prefixes: list[str] | None = None) -> list[Check]:
    """Checks named by exact key or family (`keys`) or by key prefix (`prefixes`), in registry
    order; all checks but the optional ones when neither is given. Unknown names raise SelectionError."""
    if any(not k.strip() for k in [*(keys or []), *(prefixes or [])]):
        raise SelectionError(f"{'-t' if any(not k.strip() for k in keys or []) else '-p'} is empty: give a check key "
                             "or prefix (-l lists them)")
    if not keys and not prefixes:
        return [c for c in REGISTRY.values() if not c.optional]
    chosen: set[str] = set()
    for k in keys or []:
        hit = {c for c in REGISTRY if c == k or family(c) == k}
        if not hit:
            raise SelectionError(f"unknown check {k!r} (known: {', '.join(REGISTRY)}; -l lists them)")
        chosen |= hit
    for p in prefixes or []:
        hit = {c for c in REGISTRY if c.startswith(p)}
        if not hit:
            raise SelectionError(f"no check key starts with {p!r} (known: {', '.join(REGISTRY)})")
        chosen |= hit
    return [c for k, c in REGISTRY.items() if k in chosen]


def run_check(check: Check, ctx: Context) -> Result:
    t0 = time.monotonic()
    try:
        out = check.fn(ctx)
        if not isinstance(out, Outcome) or out.status not in STATUSES:
            raise TypeError(f"check {check.key} returned {out!r}, not an Outcome")
    except Exception as e:  # noqa: BLE001 - a broken check is a FAIL row; the run goes on
        out = failed(f"check raised {type(e).__name__}: {e}",
                     traceback=traceback.format_exc(limit=8).splitlines()[-8:])
    res = Result(check.key, out.status, out.summary, out.details, round(time.monotonic() - t0, 3))
    ctx.results.append(res)
    return res


def run(checks: list[Check], ctx: Context, progress: Callable[[Result], None] | None = None) -> list[Result]:
    out = []
    for c in checks:
        r = run_check(c, ctx)
        if progress:
            progress(r)
        out.append(r)
    return out
