"""Timing views (README.md, "Timing views"): what is inside a phase's time, named in every record.

  api     what a training step pays for one call (layout, metadata, host waits, local permute):
          barrier before each call, per-iteration max over ranks, median (timing.Timer.run).
  cached  the backend's call repeated with the checked dispatch's handle / metadata reused, as
          DeepEP's test_intranode and HybridEP's test time it: calls queued back to back, the
          mean of the iterations after the first (DeepEP tests/utils.py `bench`), per rank; the
          record keeps rank 0's (what those tests print) and the max over ranks.
  kernel  the communication kernels alone, from the profiler: their device time per call,
          averaged over the profiled calls (DeepEP's `bench_kineto`), per rank; rank 0 and max.
  graph   the backend's graph-safe calls, dispatch + combine pairs captured back to back in one CUDA graph
          with the api view's L2 flush before each phase, replayed, timed mark to mark inside it (TRT-LLM's
          and MSCCL++'s EP benches time under graphs); api - graph is the host overhead.
Every view of a phase moves the same data; views differ only in the host and metadata work inside.
A view a backend cannot give is recorded as {"none": why}; a graph replay that returns wrong data
or hangs, as {"fail": why} (and the backend's check is FAIL).
"""
from __future__ import annotations

import statistics
import time

import torch

from .timing import Timer, agree_error, kernel_profile

VIEWS = ("api", "cached", "kernel", "graph")
KERNEL_ROWS = 8      # the largest kernels of a phase (or of its cached call) kept in the record
CACHED_AGG = "mean of back-to-back calls after the first (DeepEP tests/utils.py bench); rank 0 and max over ranks"
KERNEL_AGG = ("device time of the communication kernels per call, mean over profiled calls (DeepEP "
              "bench_kineto); rank 0 and max over ranks")
API_AGG = "median over iterations of the per-iteration max over ranks, a barrier before each call"


def none(why: str) -> dict:
    return {"none": why}


def _per_rank(timer: Timer, value: float, rank: int, *more: float) -> list[float]:
    """[rank 0's value, max over ranks, max over ranks of each of `more`], in one collective;
    every rank must call this."""
    return timer.agree_max([value if rank == 0 else 0.0, value, *more])


def cached(timer: Timer, fn, iters: int, warmup_ms: float, rank: int) -> dict:
    """The cached view; on CUDA also the cached call's own kernels, each call behind the L2 flush as timed here
    (rank 0's; what the graph view replays, and the floor of both)."""
    timer.warmup(fn, warmup_ms)
    times = timer.queued(fn, max(iters, 2) + 1)[1:]
    r0, mx = _per_rank(timer, statistics.fmean(times) * 1e6, rank)
    per_iter = timer.agree_max([t * 1e6 for t in times])       # for A/B verdicts on this view (report, flags)
    out = {"mean_us": r0, "max_over_ranks_us": mx, "iters": len(times), "samples_us": [round(x, 3) for x in per_iter],
           "aggregation": CACHED_AGG}
    if timer.cuda:
        rows = profile(fn, timer, flushed=True)
        out["kernel_sum_us"] = _per_rank(timer, sum(r["us_per_iter"] for r in rows), rank)[0]
        out["kernels"] = rows[:KERNEL_ROWS]
    return out


def comm_kernel_us(rows: list[dict], names: tuple[str, ...]) -> tuple[float, list[str]]:
    """Device us per call of the kernels whose name holds one of `names`, and those kernels."""
    hit = [r for r in rows if any(n in r["kernel"] for n in names)]
    return sum(r["us_per_iter"] for r in hit), [r["kernel"] for r in hit]


def kernel(timer: Timer, rows: list[dict], names: tuple[str, ...], rank: int) -> dict:
    """The kernel view from a phase's full kernel profile (`rows`); every rank must call this."""
    us, hit = comm_kernel_us(rows, names)
    r0, mx, found = _per_rank(timer, us, rank, 1.0 if hit else 0.0)   # found: on any rank
    if not found:
        return none(f"no kernel named like {', '.join(names)} ran (e.g. EP 1, or gloo moves the bytes)")
    return {"us": r0, "max_over_ranks_us": mx, "kernels": hit, "aggregation": KERNEL_AGG}


def profile(fn, timer: Timer, flushed: bool = False) -> list[dict]:
    """Every kernel of the call (timing.kernel_profile, untruncated): calls back to back, or (flushed) each
    behind the timer's L2 flush as the api, cached and graph views time it."""
    lead = timer.lead if (flushed and timer.flushes) else None
    return kernel_profile(fn, timer.cuda, top=0, lead=lead)


def host_split(median_us: float, rows: list[dict]) -> dict:
    """Host time of a phase: what its api median holds beyond the sum of its kernels."""
    ksum = sum(r["us_per_iter"] for r in rows)
    return {"kernel_sum_us": ksum, "host_us": median_us - ksum}


GRAPH_CALLS = 4     # dispatch + combine pairs captured back to back in one graph (--graph-calls)
GRAPH_AGG = ("--graph-calls dispatch + combine pairs captured back to back in one CUDA graph, each phase between two "
             "timing marks (event nodes) and the api view's L2 flush captured before each, outside the marks; the "
             "graph replayed behind a barrier; a call's time is mark to mark: the mean per call on rank 0 and over "
             "ranks; median_us is the median over calls of the per-call max over ranks (as the api view's); no host "
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
        return both({"fail": f"a replay did not finish within {wait_s:.0f} s (hang)"})
    try:
        bad = check(d_g, y_g)
    except Exception as e:  # noqa: BLE001 - outputs the oracle cannot even read are wrong outputs
        bad = f"outputs unreadable: {type(e).__name__}: {e}"
    bad = agree_error(bad, group)
    if bad:
        return both({"fail": f"replayed {bad}"})
    spans, us = phase_spans(marks), {"dispatch": [], "combine": []}
    for _ in range(-(-max(iters, 1) // calls)):
        timer.barrier()
        g.replay()
        end.record()
        if not _done(end, wait_s):
            return both({"fail": f"a replay of {calls} pairs did not finish within {wait_s:.0f} s (hang)"})
        for phase in us:
            us[phase] += [a.elapsed_time(b) * 1e3 for a, b in spans[phase]]
    return {p: _graph_view(timer, us[p], rank, plan.mode, calls, timer.flushes) for p in us}


def _graph_view(timer: Timer, us: list[float], rank: int, mode: str, calls: int, flushed: bool) -> dict:
    per_call = timer.agree_max(us)
    r0, mx = _per_rank(timer, statistics.fmean(us), rank)
    return {"us": r0, "max_over_ranks_us": mx, "median_us": statistics.median(per_call),
            "samples_us": [round(x, 3) for x in per_call], "calls": len(us), "calls_per_graph": calls,
            "l2_flush": flushed, "mode": mode, "aggregation": GRAPH_AGG}
