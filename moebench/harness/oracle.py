"""The correctness check every backend passes before it is timed (DESIGN.md, Backend protocol): the
correctness expert multiplies each row by (global expert id + 1); dispatch must hand each local expert
exactly the oracle's rows (a multiset, bit for bit), and combine must return sum_k w[t,k] * (e_k + 1) * x[t].
Graph replays and soak calls are checked by the same functions."""
from __future__ import annotations

import dataclasses

import torch

from ..backends import base
from ..core import reference
from ..core.workload import Workload


def expert_outputs(d: base.Dispatched, rank: int, w: Workload) -> torch.Tensor:
    """The correctness experts applied to the dispatched rows, zero rows for any padding past them."""
    tpe = reference.counts(d.tokens_per_expert)
    y = reference.apply_experts(d.x_RH[: sum(tpe)], tpe, rank, w, d.scales_RS)
    rows = d.x_RH.shape[0]
    return y if y.shape[0] == rows else torch.cat([y, y.new_zeros(rows - y.shape[0], *y.shape[1:])])


def moved(d: base.Dispatched, where) -> base.Dispatched:
    """The dispatch's rows, scales and counts on `where` (one copy each; the handle stays): the oracle then runs
    there."""
    where = torch.device(where)
    if d.x_RH.device == where:
        return d
    on = lambda t: t.to(where) if isinstance(t, torch.Tensor) else t      # noqa: E731
    return dataclasses.replace(d, x_RH=on(d.x_RH), scales_RS=on(d.scales_RS), tokens_per_expert=on(d.tokens_per_expert))


def _received(d: base.Dispatched, w: Workload, rank: int, dev) -> tuple:
    """(rows, scales or None) received and (rows, scales or None) expected, per local expert."""
    tpe = reference.counts(d.tokens_per_expert)
    got_scales = reference.split_rows(d.scales_RS, tpe) if d.scales_RS is not None else None
    return (reference.split_rows(d.x_RH, tpe), got_scales, *reference.expected_dispatch(w, rank, dev))


def dispatch_error(d: base.Dispatched, w: Workload, rank: int, dev) -> str:
    """'' when each local expert received exactly the oracle's rows, else the first difference."""
    err = reference.check_dispatch(*_received(d, w, rank, dev), rank, w)
    return "dispatch: " + err if err else ""


def dispatch_bad_rows(d: base.Dispatched, w: Workload, rank: int, dev) -> list[tuple[int, int]]:
    """[(global expert, rows wrong)] of this dispatch; [] when every expert got the oracle's rows."""
    return reference.dispatch_bad_rows(*_received(d, w, rank, dev), rank, w)


def combine_error(out, payload, idx, wt, w: Workload, scales) -> str:
    err = reference.check_combine(out, reference.expected_combine(payload, idx, wt, w, scales))
    return "combine: " + err if err else ""


def combine_bad_tokens(out, payload, idx, wt, w: Workload, scales) -> list[int]:
    """The tokens whose combined row is wrong; [] when all are right."""
    return reference.combine_bad_tokens(out, reference.expected_combine(payload, idx, wt, w, scales))


def check(b, w: Workload, rank: int, payload, idx, wt, scales, dev):
    """One dispatch and one combine through the oracle: (error or '', the dispatch, the expert outputs
    combined from it)."""
    d = b.dispatch(payload, idx, wt, scales)
    err = dispatch_error(d, w, rank, dev)
    if err:
        return err, d, None
    y = expert_outputs(d, rank, w)
    return combine_error(b.combine(y, d.handle), payload, idx, wt, w, scales), d, y
