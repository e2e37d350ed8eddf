"""Timing views (README.md, "Timing views"): what is inside a phase's time, named in every record.

One module per view in this package; each declares NAME, ORDER (when it runs: api first, its times are
the record's timing; graph last, a capture that goes wrong leaves nothing else untimed), ABOUT (its
legend), SAMPLED (it keeps per-iteration samples, so A/B verdicts can use it) and
`run(case) -> {phase: view}`. Every view of a phase has one shape:

    {"us": its figure, "max_over_ranks_us": ..., "samples_us": [...] (SAMPLED views),
     "aggregation": how it was taken, ...what else that view records}

or {"none": why} where the backend cannot give it, {"fail": why} where it gave wrong data (the backend's
check is then FAIL). Every view of a phase moves the same data; views differ only in the host and
metadata work inside. A new view is one module here (and, where backends differ, an optional Backend
hook such as `cached_phases` or `graph_plan`): the registry below finds it, the record, the table's
--wide columns, report and `megatron flags --view` take it from there.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from ...records.shapes import Tails, View
from ...records.shapes import view_fail as fail  # noqa: F401  (the views' shapes, named once, in records/)
from ...records.shapes import view_none as none
from .profile import KERNEL_ROWS  # noqa: F401  (the kernel rows a record keeps, for the runner)

PHASES = ("dispatch", "combine")
NOT_ASKED = "not asked for (--views leaves {} out)"


def figure(us: float, max_over_ranks_us: float, aggregation: str, samples_us: list[float] | None = None,
           **extra) -> dict:
    """A view's one shape (records/shapes.View; the view's own extras after the common keys)."""
    return View(us, max_over_ranks_us, aggregation, samples_us, extra).asdict()


def across(timer, values_us: list[float]) -> tuple[list[float], dict]:
    """(the per-iteration max over ranks, the tail and the straggler: records/shapes.Tails' keys) of every rank's
    per-iteration microseconds; every rank must call this."""
    ranks = timer.across(values_us)
    return [max(col) for col in zip(*ranks)], Tails.of(ranks).asdict()


@dataclass
class Case:
    """One backend's checked case on one rank: what every view times.
    phases: the api's zero-argument callables by phase (dispatch, combine and the backend's extra ones);
    d, y: the checked dispatch and its expert outputs (their handle serves the timed combines);
    check(d_graph, y_graph): the oracle on a replay's outputs; the api view fills stats and rows."""
    backend: Any
    timer: Any
    spec: Any
    rank: int
    inputs: tuple                      # payload, topk_idx, topk_w, scales
    d: Any
    y: Any
    phases: dict[str, Callable]
    check: Callable
    stats: dict = field(default_factory=dict)     # phase -> timing.Stats (api)
    rows: dict = field(default_factory=dict)      # phase -> the phase's kernel profile (api, CUDA or --profile)
    timing: dict = field(default_factory=dict)    # phase -> the record's timing dict (api, + figures across views)
    fault: Callable | None = None                 # --inject: wrap(fn) of the timed dispatch calls (harness/fault.py)


def _modules() -> dict:
    found = []
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            found.append(mod)
    return {m.NAME: m for m in sorted(found, key=lambda m: m.ORDER)}


REGISTRY = _modules()
VIEWS = tuple(REGISTRY)
SAMPLED = tuple(n for n, m in REGISTRY.items() if m.SAMPLED)
LEGEND = "; ".join(f"{n}: {m.ABOUT}" for n, m in REGISTRY.items())


def run_all(case: Case, asked: tuple[str, ...], after_api=None) -> dict:
    """{phase: {view: result}} for every view, in ORDER; a view not asked for is {"none": why}.
    after_api(): called once the api view (the calls as a training step makes them) is done."""
    out: dict[str, dict] = {}
    for name, mod in REGISTRY.items():
        res = mod.run(case) if name in asked or name == "api" else {p: none(NOT_ASKED.format(name)) for p in PHASES}
        for phase, v in res.items():
            out.setdefault(phase, {})[name] = v
        if name == "api" and after_api:
            after_api()
    return out


def failure(views: dict) -> str:
    """The first {"fail": why} among a backend's views ('' when none): the backend FAILs with it."""
    for phase in PHASES:
        for name, v in (views.get(phase) or {}).items():
            if "fail" in v:
                return f"{name} view: {v['fail']}"
    return ""
