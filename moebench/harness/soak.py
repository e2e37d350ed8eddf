"""Soak: rare, silent corruption that one check before timing does not see (`--soak N`).

DeepEP's low-latency combine returned one wrong row in 1.5-3.3% of calls on Blackwell (deepseek-ai/DeepEP
issues 700 and 621, a missing proxy fence) and the same class of bug hit other EP stacks: a gate that
checks each case once passes such a build. A soak makes N calls after the timed ones, each on freshly drawn
tokens and routing (the workload's seed advanced per call), and checks every dispatch (the multiset of rows
per local expert, by a hash of each row's bytes: a wrong row slips through with probability about 2^-31) and
every combine against the oracle, counting the wrong rows and tokens; where the backend has a graph-safe
call, its graph is replayed N times too, each replay poisoned and checked (bit for bit). It runs in its own
launch of the ranks, so a crash or hang in it ends only the soak: the record says at which call and how,
with the counts of the calls before (each rank writes its progress to a file after every call). --timeout
bounds the soak's launch: a soak still advancing when it runs out is stopped as `timeout` with its rate, one
whose calls stopped is a `hang`. --soak-seconds is its own budget: the ranks agree after every call whether it
has run out and stop together; either way a soak its time ended with no call corrupted is BUDGET, not FAIL.

Where the time goes: each rank sums its host-clock seconds per stage of a checked call (inputs, dispatch, the
dispatch check, the experts, combine, the combine check; a sync after dispatch and after combine, so that their
kernels are not billed to the checks: at 565af70 ncclep ht's 46 ms of `check_dispatch` at EP 4 held its dispatch)
and the record keeps them (`stage_ms`). Ranks that share a GPU check on the host, one torch thread each
(harness/launch.py): the other rank's communication kernel spins on the GPU while this one checks, and every gap in
a queue of small checking kernels handed it a whole time slice (~150 ms a call at EP 2, T 64, with the check on the
GPU; 0.4-0.6 s checked on the host with every core per rank). On one H100 a checked call now takes 22 ms
(deepep-ll), 36 ms (deepep) and 29 ms (hybridep), the checks 12-19 ms of it
(bench/results/dispatch-shared-soak-h100.jsonl).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

from ..core.workload import rank_inputs
from . import oracle, views
from .launch import LaunchError, RankContext, environment, run_ranks
from .stage import make_backend, make_case
from .timing import Timer, agree_error

SEED_STRIDE = 1_000_003          # call i draws its tokens and routing from seed + SEED_STRIDE * (i + 1)
KEEP_BAD = 20                    # bad calls kept per rank with their detail
STALL_S = 30.0                   # no call finished for this long when the time ran out: a hang


STAGES = ("inputs", "dispatch", "check_dispatch", "experts", "combine", "check_combine")


def check_device(ctx: RankContext) -> torch.device:
    """Where a soak checks its outputs: the host when ranks share a GPU (see the module's docstring), else the
    rank's device."""
    return torch.device("cpu") if ctx.ranks_per_gpu > 1 else ctx.device


def one_call(b, w, rank: int, dev, where=None, clock: dict | None = None) -> dict | None:
    """One dispatch + combine on fresh inputs, checked on `where` (default: dev); None when right, else what was
    wrong. clock: {stage: seconds} to add this call's host-clock time per stage to."""
    where = dev if where is None else torch.device(where)
    laps = _Laps(clock, dev)
    host = rank_inputs(w, rank)                                    # made on the host, moved once
    x, idx, wt, q, s = (t.to(dev) if t is not None else None for t in host)
    mine = host if where.type == "cpu" else (x, idx, wt, q, s)     # the inputs where the check runs
    payload = q if q is not None else x
    laps("inputs")
    try:
        d = b.dispatch(payload, idx, wt, s)
        laps("dispatch", sync=True)
        got = oracle.moved(d, where)
        rows = oracle.dispatch_bad_rows(got, w, rank, where)
        laps("check_dispatch")
        y = oracle.expert_outputs(b, d, rank, w, src=got)   # computed where checked, written where combine reads
        laps("experts")
        out = b.combine(y, d.handle)
        laps("combine", sync=True)
        hx, hidx, hwt, hq, hs = mine
        tokens = oracle.combine_bad_tokens(out.to(where), hq if hq is not None else hx, hidx, hwt, w, hs)
        laps("check_combine")
    except Exception as e:  # noqa: BLE001 - an output the oracle cannot even read is a wrong output
        return {"rows": [], "tokens": [], "error": f"{type(e).__name__}: {str(e)[:200]}"}
    if not rows and not tokens:
        return None
    return {"rows": rows, "tokens": tokens[:16], "n_tokens": len(tokens)}


class _Laps:
    """Host-clock seconds per stage, added to `into` (nothing when None)."""

    def __init__(self, into: dict | None, dev):
        self.into, self.cuda, self.t = into, torch.device(dev).type == "cuda", time.perf_counter()

    def __call__(self, stage: str, sync: bool = False) -> None:
        if self.into is None:
            return
        if sync and self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.into[stage] = self.into.get(stage, 0.0) + now - self.t
        self.t = now


def out_of_time(deadline: float | None, group) -> bool:
    """Every rank's answer to "has the budget run out?" (True on all ranks once it has on any), so that all
    stop after the same call. On the host: a gloo group's collective needs no device work."""
    if deadline is None:
        return False
    late = time.monotonic() > deadline
    if group is None or dist.get_world_size(group) == 1:
        return late
    dev = "cpu" if dist.get_backend(group) == "gloo" else torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([int(late)], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def _progress(path: str | None, state: dict) -> None:
    if path:
        tmp = path + ".part"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)


def soak_main(ctx: RankContext, spec, name: str, progress_dir: str | None) -> dict:
    """Every rank: the backend set up and checked once, then `spec.soak` calls on fresh inputs, then the
    graph's replays, all within --soak-seconds when given, the backend rebuilt every --soak-recreate calls. Returns
    this rank's counts: {done, bad: [...], rows, tokens, graph, budget (the call the budget stopped it at, or absent),
    stage_s, rebuild_ms, knobs, bypassed}."""
    dev, w = ctx.device, spec.workload
    path = os.path.join(progress_dir, f"rank{ctx.rank}.json") if progress_dir else None
    state = {"rank": ctx.rank, "done": 0, "bad": [], "bad_calls": [], "rows": 0, "tokens": 0, "stage_s": {}}
    b, err = make_backend(spec, name, ctx)
    if err:
        return {**state, "error": err}
    state["knobs"], state["bypassed"] = b.knobs(), list(b.bypassed)      # named in the record, as the phases'
    deadline = time.monotonic() + spec.soak_seconds if spec.soak_seconds else None
    timer, where = Timer.for_run(spec, dev, ctx.group), check_device(ctx)
    state["checked_on"] = where.type
    for i in range(spec.soak):
        if out_of_time(deadline, ctx.group):
            state["budget"] = {"calls": i, "seconds": spec.soak_seconds}
            break
        if spec.soak_recreate and i and i % spec.soak_recreate == 0:
            b, err = _rebuild(b, spec, name, ctx, state)
            if err:
                return {**state, "error": f"rebuilt before call {i} (--soak-recreate): {err}"}
        wrong = one_call(b, w.replace(seed=(w.seed + SEED_STRIDE * (i + 1)) % (2**63)), ctx.rank, dev, where,
                         state["stage_s"])
        state["done"] = i + 1
        if wrong:
            state["bad_calls"].append(i)
            state["rows"] += sum(n for _, n in wrong["rows"])
            state["tokens"] += wrong.get("n_tokens", 0)
            if len(state["bad"]) < KEEP_BAD:
                state["bad"].append({"call": i, "rank": ctx.rank, **wrong})
        _progress(path, state)
    state["graph"] = _graph(b, timer, ctx, spec, where, (lambda: out_of_time(deadline, ctx.group)))
    state["knobs"] = b.knobs()                # what the calls resolved (the SMs a library picked)
    b.teardown()
    return state


def _rebuild(b, spec, name: str, ctx: RankContext, state: dict):
    """The backend destroyed and built again (--soak-recreate; DeepEP V2's pressure test rebuilds its buffer per
    seed), this rank's ms in state["rebuild_ms"]: (the new backend, '') or (None, the error every rank agrees on)."""
    t0 = time.perf_counter()
    b.teardown()
    b, err = make_backend(spec, name, ctx)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    state.setdefault("rebuild_ms", []).append(round((time.perf_counter() - t0) * 1e3, 3))
    return (None, err) if err else (b, "")


def _graph(b, timer, ctx, spec, where, out_of_time_now) -> dict | None:
    """The graph view's replays, soaked (harness/views/graph.py), on the checked base case."""
    if "graph" not in spec.views:
        return None
    x, idx, wt, q, s = rank_inputs(spec.workload, ctx.rank, ctx.device)
    payload = q if q is not None else x
    msg, d, y = oracle.check(b, spec.workload, ctx.rank, payload, idx, wt, s, ctx.device)
    if agree_error(msg, ctx.group):
        return {"none": f"the base case failed its check: {msg}"}
    case = make_case(b, timer, ctx, spec, (payload, idx, wt, s), d, y, check_on=where)
    return views.REGISTRY["graph"].soak(case, spec.soak, out_of_time=out_of_time_now)


def run_soak(spec, name: str) -> tuple[list[dict], str | None, str | None]:
    """The soak's launch: (every rank's counts, the error that stopped it or None, the crash: a signal or
    "hang"). After a crash or hang the counts are the ranks' last progress files."""
    progress = tempfile.mkdtemp(prefix="moebench-soak-")
    t0 = time.monotonic()
    try:
        with environment(spec.env):
            ranks = run_ranks(soak_main, spec.workload.ep, spec.device, spec.timeout_s, args=(spec, name, progress),
                              ranks_per_gpu=spec.ranks_per_gpu, pg_timeout_s=spec.pg_timeout)
        return ranks, None, None
    except LaunchError as e:
        ranks, crash = _read_progress(progress), e.crash
        why = f"{str(e).splitlines()[0][:400]} ({time.monotonic() - t0:.0f} s in)"
        if crash == "hang" and _advancing(progress, STALL_S):
            done = min((r.get("done", 0) for r in ranks), default=0)
            crash, why = "timeout", (f"{done} calls in {time.monotonic() - t0:.0f} s, still advancing when --timeout "
                                     f"{spec.timeout_s:.0f} s (the whole soak's budget) ran out: raise it")
        return ranks, why, crash
    except Exception as e:  # noqa: BLE001 - reported as the soak's failure
        traceback.print_exc()
        return _read_progress(progress), f"{type(e).__name__}: {e}", None


def _advancing(folder: str, within_s: float) -> bool:
    """A rank wrote progress in the last `within_s` seconds: a slow soak, not a hang."""
    now = time.time()
    try:
        return any(now - os.path.getmtime(os.path.join(folder, n)) < within_s for n in os.listdir(folder))
    except OSError:
        return False


def _read_progress(folder: str) -> list[dict]:
    out = []
    for n in sorted(os.listdir(folder)):
        if n.endswith(".json"):
            try:
                with open(os.path.join(folder, n)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return out
