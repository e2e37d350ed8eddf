"""Verdicts over repeated runs (dispatch --repeats N): each repeat started every backend's ranks afresh, the
backend order rotated, so a repeat's median is one independent sample of a backend; two arms are compared
repeat by repeat, paired, as AWS's fair EP comparison bootstraps paired deltas over process starts ("iterations
inside one process are not independent samples": awslabs/awsome-distributed-ai,
micro-benchmarks/expert-parallelism/ep-backend-comparison, PR #1238).

Pairs: the same repeat of the same run (`repeat.run`, `repeat.index`) within one file; across two files (two
containers), the k-th run's repeat i of each. A pair whose two records name different input digests
(routing_sha256, payload_sha256) compares two workloads: RepeatError, naming both records' file:line.
The ratio B/A is the geometric mean over pairs of each pair's B/A; its 95% interval a bootstrap over pairs.
"""
from __future__ import annotations

import math

import numpy as np

from . import schema
from .schema import PHASES

MIN_PAIRS = 2                  # fewer pairs: no interval over repeats (the per-iteration one stands in, and says so)
DIGESTS = ("routing_sha256", "payload_sha256")


class RepeatError(ValueError):
    """A paired comparison of records that ran on different inputs: one line, exit 2."""


def has_repeats(recs: list[dict]) -> bool:
    return any(isinstance(r.get("repeat"), dict) for r in recs)


def _where(r: dict) -> str:
    return f"{r.get('_file', '?')}:{r.get('_line', '?')}"


def medians(recs: list[dict], view: str = "api", ordinal: bool = False, phases: tuple | None = None) -> dict:
    """{repeat key: (us, a record of it)}: each repeat's median in `view`, summed over `phases` where given (a
    repeat lacking one of them left out); key (run, index), or (k-th run, index) with `ordinal` (across files).
    Records without a repeat tag or without the view are left out."""
    per: dict = {}
    runs: dict = {}
    for r in recs:
        rep, t = r.get("repeat"), schema.view_timing(r, view)
        if not isinstance(rep, dict) or not t or (phases and r.get("phase") not in phases):
            continue
        run = runs.setdefault(rep.get("run"), len(runs)) if ordinal else rep.get("run")
        per.setdefault((run, rep.get("index")), {})[r.get("phase")] = (float(t["median_us"]), r)
    want = set(phases or ())
    return {k: (sum(us for us, _ in by.values()), next(iter(by.values()))[1])
            for k, by in per.items() if not want or want <= set(by)}


def pairs(a: dict, b: dict) -> list[tuple[float, float]]:
    """[(A us, B us)] of the repeats both `medians` maps hold, in key order ([] under MIN_PAIRS); RepeatError where
    a pair's records name different input digests."""
    common = sorted(set(a) & set(b), key=str)
    for k in common:
        same_inputs(a[k][1], b[k][1])
    return [(a[k][0], b[k][0]) for k in common] if len(common) >= MIN_PAIRS else []


def same_inputs(ra: dict, rb: dict) -> None:
    """RepeatError unless the two records' input digests agree (a record without them is taken as it is)."""
    for key in DIGESTS:
        x, y = ra.get(key), rb.get(key)
        if x and y and x != y:
            rep = (rb.get("repeat") or {}).get("index", 0) + 1
            raise RepeatError(f"{_where(rb)}: repeat {rep} of {schema.name(rb)} ran on other inputs than "
                              f"{_where(ra)} ({schema.name(ra)}): {key} {y[:16]} vs {x[:16]}; refused: a paired "
                              "verdict needs the same inputs on both sides")


def interval(p: list[tuple[float, float]], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(B/A: the geometric mean over pairs of each pair's B/A, its 95% low, high: a bootstrap over pairs)."""
    q = np.log(np.asarray([b / a for a, b in p], float))
    idx = np.random.default_rng(seed).integers(0, q.size, (n_boot, q.size))
    lo, hi = np.quantile(np.exp(q[idx].mean(axis=1)), [0.025, 0.975])
    return math.exp(q.mean()), float(lo), float(hi)


def method(n: int) -> str:
    """How a paired interval was taken, as verdicts name it."""
    return f"paired bootstrap over {n} repeats"


def totals(recs: list[dict], view: str = "api") -> dict:
    """`medians` of dispatch + combine (megatron flags' A/B sums the two phases)."""
    return medians(recs, view, phases=PHASES)
