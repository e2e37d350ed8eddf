"""A stage every rank runs together (setup, check) and agrees on: the first rank's error on all ranks, so
no rank goes on into a collective another will never join; the backend built and set up that way."""
from __future__ import annotations

import traceback

from ..backends import base
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


def make_backend(spec, name: str, ctx: RankContext):
    """(the backend built, validated and set up on this rank, '') or (None or the backend, the error every rank
    agrees on: `WAIVED: why` when it cannot serve this run)."""
    b = None

    def prepare():
        nonlocal b
        b = base.get(name)(knob_values=spec.backend_knobs, ranks_per_gpu=ctx.ranks_per_gpu)
        b.validate(spec.workload, ctx.world)
        b.setup(ctx.group, spec.workload, ctx.device)
    err = stage(prepare, ctx.group)
    return b, err
