"""graph: the backend's graph-safe calls, dispatch + combine pairs captured back to back in one CUDA graph
with the api view's L2 flush before each phase, replayed, timed mark to mark inside it (TRT-LLM's and
MSCCL++'s EP benches time under graphs); `us` is the median over calls of the per-call max over ranks (as
the api view's), so api - graph (the record's `timing.api_minus_graph_us`) is the host overhead a step
pays without graphs. A replay's outputs are poisoned before it runs and checked by the oracle after: wrong
data or a hang is {"fail": why}. Backend hook: `graph_plan` (its graph-safe calls, or why it has none)."""
from __future__ import annotations

import statistics
import time

import torch

from ..timing import Timer, agree_error
from . import PHASES, Case, across, fail, figure, none
from .profile import per_rank

NAME, ORDER, SAMPLED = "graph", 3, True
ABOUT = "the graph-safe call replayed from a CUDA graph"


def run(case: Case) -> dict:
    timer, spec = case.timer, case.spec
    plan = case.backend.graph_plan(*case.inputs, case.d, case.y) if timer.cuda else "CPU run: no CUDA graphs"
    g = graph(timer, plan, spec.iters, case.rank, case.check, wait_s=min(120.0, spec.timeout_s / 4),
              calls=spec.graph_calls)
    for phase in PHASES:
        if g[phase].get("us") is not None and phase in case.timing:
            # to the nanosecond: two equal medians read 0, not float noise such as 1.4e-14
            case.timing[phase]["api_minus_graph_us"] = round(case.stats[phase].median_us - g[phase]["us"], 3)
    return g


GRAPH_CALLS = 4     # dispatch + combine pairs captured back to back in one graph (--graph-calls)
GRAPH_AGG = ("--graph-calls dispatch + combine pairs captured back to back in one CUDA graph, each phase between two "
             "timing marks (event nodes) and the api view's L2 flush captured before each, outside the marks; the "
             "graph replayed behind a barrier; a call's time is mark to mark: the mean per call on rank 0 and over "
             "ranks; us is the median over calls of the per-call max over ranks (as the api view's); no host "
             "work and no launch are inside")
POISON = 0xFF        # every byte of a replay's outputs before it runs: NaN in bf16 and e4m3, never a real row


def _done(event, wait_s: float) -> bool:
    """Whether the GPU reached `event` within wait_s (a hung replay must not hang the rank)."""
    deadline = time.monotonic() + wait_s
    while not event.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _capture(plan, calls: int, lead):
    """An eager pair first (JIT, buffer growth, low-latency parity); then `calls` pairs captured back to back
    in one graph: lead() (the api view's L2 flush), a mark, the dispatch, a mark, the between step, lead(), a
    mark, the combine, a mark (marks: external event nodes). Returns (graph, marks, last pair's dispatch, its
    combine); earlier pairs' outputs are dropped during capture, so the graph's pool can reuse them."""
    d = plan.dispatch()
    if plan.between:
        plan.between(d)
    plan.combine(d)
    torch.cuda.synchronize()
    marks: list = []

    def mark():
        marks.append(torch.cuda.Event(enable_timing=True, external=True))
        marks[-1].record()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(calls):
            lead()
            mark()
            d_g = plan.dispatch()
            mark()
            if plan.between:
                plan.between(d_g)
            lead()
            mark()
            y_g = plan.combine(d_g)
            mark()
    torch.cuda.synchronize()
    return g, marks, d_g, y_g


def phase_spans(marks: list) -> dict:
    """The (start, end) marks of each captured call, by phase: every pair holds four marks, dispatch
    start and end, combine start and end."""
    assert len(marks) % 4 == 0, len(marks)
    return {"dispatch": list(zip(marks[0::4], marks[1::4])), "combine": list(zip(marks[2::4], marks[3::4]))}


def graph(timer: Timer, plan, iters: int, rank: int, check, wait_s: float, calls: int = GRAPH_CALLS) -> dict:
    """The graph view of both phases: {"dispatch": view, "combine": view}. `plan` is the backend's GraphPlan
    or why it has none; check(d_graph, y_graph) -> '' or the oracle's complaint about a replay's outputs
    (poisoned before it: a replay that writes nothing or stale data fails). `calls` pairs are captured in one
    graph and it is replayed until `iters` calls are timed. A view is {"none": why} when capture is
    impossible and {"fail": why} when a replay is wrong or hangs. Every rank calls this."""
    both = lambda v: {"dispatch": v, "combine": v}  # noqa: E731
    if isinstance(plan, str):
        return both(none(plan))
    err, group = "", timer.group
    try:
        g, marks, d_g, y_g = _capture(plan, calls, timer.lead)
    except Exception as e:  # noqa: BLE001 - a call that cannot be captured is a view that does not exist
        err = f"capture failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    err = agree_error(err, group)
    if err:
        return both(none(err))
    d_g.x_RH.view(torch.uint8).fill_(POISON)
    y_g.view(torch.uint8).fill_(POISON)
    g.replay()
    end = torch.cuda.Event()
    end.record()
    if not _done(end, wait_s):
        return both(fail(f"a replay did not finish within {wait_s:.0f} s (hang)"))
    try:
        bad = check(d_g, y_g)
    except Exception as e:  # noqa: BLE001 - outputs the oracle cannot even read are wrong outputs
        bad = f"outputs unreadable: {type(e).__name__}: {e}"
    bad = agree_error(bad, group)
    if bad:
        return both(fail(f"replayed {bad}"))
    spans, us = phase_spans(marks), {"dispatch": [], "combine": []}
    for _ in range(-(-max(iters, 1) // calls)):
        timer.barrier()
        g.replay()
        end.record()
        if not _done(end, wait_s):
            return both(fail(f"a replay of {calls} pairs did not finish within {wait_s:.0f} s (hang)"))
        for phase in us:
            us[phase] += [a.elapsed_time(b) * 1e3 for a, b in spans[phase]]
    return {p: _graph_view(timer, us[p], rank, plan.mode, calls, timer.flushes) for p in us}


def _graph_view(timer: Timer, us: list[float], rank: int, mode: str, calls: int, flushed: bool) -> dict:
    per_call, tails = across(timer, us)
    r0, mx = per_rank(timer, statistics.fmean(us), rank)
    return figure(statistics.median(per_call), mx, GRAPH_AGG, per_call, rank0_mean_us=r0, calls=len(us),
                  calls_per_graph=calls, l2_flush=flushed, mode=mode, **tails)


def soak(case: Case, replays: int, wait_s: float = 120.0, out_of_time=lambda: False) -> dict:
    """`replays` replays of one captured dispatch + combine pair, its outputs poisoned before each and checked
    by the oracle after (harness/soak.py): {replays, corrupted, first} or {none: why}; {..., budget: replays
    made} when out_of_time() (the same answer on every rank) stopped it first. Every rank calls this."""
    timer = case.timer
    plan = case.backend.graph_plan(*case.inputs, case.d, case.y) if timer.cuda else "CPU run: no CUDA graphs"
    if isinstance(plan, str):
        return none(plan)
    err = ""
    try:
        g, _, d_g, y_g = _capture(plan, 1, timer.lead)
    except Exception as e:  # noqa: BLE001 - a call that cannot be captured: no graph to soak
        err = f"capture failed: {type(e).__name__}: {str(e).strip()[:300]}"
    if agree_error(err, timer.group):
        return none(err)
    bad, end = [], torch.cuda.Event()
    for i in range(replays):
        if out_of_time():
            return {"replays": i, "corrupted": len(bad), "first": bad[:5], "mode": plan.mode, "budget": i}
        d_g.x_RH.view(torch.uint8).fill_(POISON)
        y_g.view(torch.uint8).fill_(POISON)
        timer.barrier()
        g.replay()
        end.record()
        if not _done(end, wait_s):
            return {"replays": i, "corrupted": len(bad), "first": bad[:5], "stopped": f"replay {i} hung"}
        try:
            wrong = case.check(d_g, y_g)
        except Exception as e:  # noqa: BLE001 - unreadable outputs are wrong outputs
            wrong = f"outputs unreadable: {type(e).__name__}: {e}"
        if agree_error(wrong, timer.group):
            bad.append({"replay": i, "error": wrong[:200]})
    return {"replays": replays, "corrupted": len(bad), "first": bad[:5], "mode": plan.mode}
