"""The correctness check every backend passes before it is timed (DESIGN.md, Backend protocol): the
correctness expert multiplies each row by (global expert id + 1) and by the routing prob the row arrived with,
as Megatron-Core's experts apply the probs (or leaves the prob to the library's combine kernel where it weighs
there: Backend.probs_in_combine); dispatch must hand each local expert exactly the oracle's rows (a multiset,
bit for bit) with their probs, and combine, an unweighted sum, must return sum_k w[t,k] * (e_k + 1) * x[t].
The experts write where the backend's combine reads (Backend.expert_buffer: zero-copy buffers, low-latency
slots), untimed, as a training step's experts would. Graph replays and soak calls are checked by the same
functions."""
from __future__ import annotations

import dataclasses

import torch

from ..backends import base
from ..core import reference
from ..core.workload import Workload


def slot_rows(d: base.Dispatched) -> torch.Tensor:
    """The flat [L*M] positions of a slot layout's received rows, expert by expert (one host sync for the counts)."""
    n = torch.tensor(reference.counts(d.tokens_per_expert), device=d.x_RH.device)
    M = d.x_RH.shape[1]
    return (torch.arange(M, device=n.device)[None, :] < n[:, None]).view(-1).nonzero().squeeze(1)


def grouped(d: base.Dispatched) -> base.Dispatched:
    """d's received rows grouped by local expert, on the host's count: a slot layout gathered into [R, H], rows past
    the count (a fixed budget's, padding) left out. The oracle's view of a dispatch, never inside a timed call."""
    if not d.slots:
        n = sum(reference.counts(d.tokens_per_expert))
        if d.x_RH.shape[0] == n:
            return d
        cut = lambda t: t[:n] if t is not None else None                  # noqa: E731
        return dataclasses.replace(d, x_RH=d.x_RH[:n], scales_RS=cut(d.scales_RS), probs_R=cut(d.probs_R))
    at = slot_rows(d)
    flat = lambda t: t.flatten(0, 1)[at] if t is not None else None     # noqa: E731
    return dataclasses.replace(d, x_RH=flat(d.x_RH), scales_RS=flat(d.scales_RS), probs_R=flat(d.probs_R),
                               tokens_per_expert=reference.counts(d.tokens_per_expert), slots=False)


def expert_probs(b, d: base.Dispatched) -> torch.Tensor | None:
    """The probs the experts apply: what dispatch handed over, or None where the library weighs in its combine.
    A dispatch of a backend that does neither cannot be right: ValueError."""
    if b is not None and b.probs_in_combine:
        return None
    if d.probs_R is None:
        raise ValueError("dispatch handed the experts no routing probs (Dispatched.probs_R), and the backend does not "
                         "weigh in its combine")
    return d.probs_R


def expert_outputs(b, d: base.Dispatched, rank: int, w: Workload, src: base.Dispatched | None = None) -> torch.Tensor:
    """The correctness experts applied to what dispatch handed over, in bf16, written into the backend's expert
    buffer where it has one (what its combine reads), else into a fresh tensor of d's rows or slots on d's device
    (zero rows or slots past the received ones). `src`: d's rows already grouped elsewhere (the soak's copy on the
    host) to compute from. `b` None: a backend that carries the probs to the experts."""
    g = src if src is not None else grouped(d)
    tpe = reference.counts(g.tokens_per_expert)
    n = sum(tpe)
    y = reference.apply_experts(g.x_RH[:n], tpe, rank, w, g.scales_RS, expert_probs(b, g))
    y = y.to(d.x_RH.device)
    out = b.expert_buffer(d) if b is not None else None
    if out is None and not d.slots:
        rows = d.x_RH.shape[0]
        return y if rows == n else torch.cat([y, y.new_zeros(rows - n, y.shape[1])])
    if out is None:
        out = y.new_zeros(*d.x_RH.shape[:2], y.shape[-1])
    if d.slots:
        out.view(-1, out.shape[-1]).index_copy_(0, slot_rows(d), y)
    else:
        out[:n].copy_(y)
    return out


def moved(d: base.Dispatched, where) -> base.Dispatched:
    """The dispatch's rows, scales, probs and counts on `where`, grouped (one copy each; the handle stays): the
    oracle then runs there."""
    where, d = torch.device(where), grouped(d)
    if d.x_RH.device == where:
        return d
    on = lambda t: t.to(where) if isinstance(t, torch.Tensor) else t      # noqa: E731
    return dataclasses.replace(d, x_RH=on(d.x_RH), scales_RS=on(d.scales_RS), probs_R=on(d.probs_R),
                               tokens_per_expert=on(d.tokens_per_expert))


def _received(d: base.Dispatched, w: Workload, rank: int, dev, probs: bool = False) -> tuple:
    """(rows, scales or None) received and (rows, scales or None) expected, per local expert; with `probs` then
    the received probs (None where the dispatch carries none) and the expected ones."""
    g = grouped(d)
    tpe = reference.counts(g.tokens_per_expert)
    split = lambda t: reference.split_rows(t, tpe) if t is not None else None    # noqa: E731
    exp = reference.expected_dispatch(w, rank, dev, probs=probs)
    got = (split(g.x_RH), split(g.scales_RS), *exp[:2])
    return (*got, split(g.probs_R), exp[2]) if probs else got


def dispatch_error(d: base.Dispatched, w: Workload, rank: int, dev) -> str:
    """'' when each local expert received exactly the oracle's rows (and, where dispatch carries probs, each row
    its routing prob), else the first difference."""
    got_rows, got_scales, exp_rows, exp_scales, *probs = _received(d, w, rank, dev, probs=d.probs_R is not None)
    err = reference.check_dispatch(got_rows, got_scales, exp_rows, exp_scales, rank, w, *probs)
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
    try:
        y = expert_outputs(b, d, rank, w)
    except ValueError as e:
        return f"dispatch: {e}", d, None
    return combine_error(b.combine(y, d.handle), payload, idx, wt, w, scales), d, y
