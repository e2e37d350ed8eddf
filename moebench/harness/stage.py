"""A stage every rank runs together (setup, check) and agrees on: the first rank's error on all ranks, so
no rank goes on into a collective another will never join; the backend built and set up that way, and the
Case the timing views (and the soak's graph replays) take once it has passed its check."""
from __future__ import annotations

import time
import traceback

import torch

from ..backends import base
from . import oracle, views
from .launch import RankContext
from .timing import agree_error


class CheckFailed(Exception):
    """The backend ran but returned wrong tokens: the oracle's message."""


WAIVED = "WAIVED: "


def stage(fn, group) -> str:
    """Run fn on every rank; the first rank's error (or '') on all ranks, so that no rank goes on
    into a collective that another rank will never join."""
    try:
        fn()
        err = ""
    except base.Unavailable as e:
        err = WAIVED + str(e)
    except CheckFailed as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - a failing backend is a FAIL row, not a crash
        err = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return agree_error(err, group)


def make_backend(spec, name: str, ctx: RankContext, clock: dict | None = None):
    """(the backend built, validated and set up on this rank, '') or (None or the backend, the error every rank
    agrees on: `WAIVED: why` when it cannot serve this run). clock: gets `build_ms`, this rank's time to build it
    (the device synchronized; the ranks' agreement after it left out: harness/setupcost.py)."""
    b = None

    def prepare():
        nonlocal b
        t0 = time.perf_counter()
        b = base.get(name)(knob_values=spec.backend_knobs, ranks_per_gpu=ctx.ranks_per_gpu)
        b.validate(spec.workload, ctx.world)
        b.setup(ctx.group, spec.workload, ctx.device)
        if clock is not None:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            clock["build_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    err = stage(prepare, ctx.group)
    return b, err


def make_case(b, timer, ctx, spec, inputs: tuple, d, y, check_on=None) -> views.Case:
    """What every view times: the api callables of every phase (the checked dispatch's handle serves the
    timed combines) and the oracle a graph replay's outputs go through (on `check_on`, default the rank's
    device: the soak checks on the host where ranks share a GPU)."""
    payload, idx, wt, s = inputs
    w = spec.workload
    phases = {"dispatch": lambda: b.dispatch(payload, idx, wt, s), "combine": lambda: b.combine(y, d.handle)}
    phases.update(b.extra_phases(payload, idx, wt))
    where = torch.device(check_on) if check_on is not None else ctx.device
    on = lambda t: t.to(where) if t is not None else None       # noqa: E731
    check = lambda dg, yg: (oracle.dispatch_error(oracle.moved(dg, where), w, ctx.rank, where)  # noqa: E731
                            or oracle.combine_error(on(yg), on(payload), on(idx), on(wt), w, on(s)))
    return views.Case(b, timer, spec, ctx.rank, inputs, d, y, phases, check)
