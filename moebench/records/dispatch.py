"""A moebench.dispatch record from one backend's rank result: the byte rule's traffic, GB/s against the
ceilings, the check, the views, the provenance. One record per phase (schema.DispatchRecord)."""
from __future__ import annotations

from ..core import ceilings, traffic
from ..env.transport import node_net_ceiling
from . import provenance
from .schema import DispatchRecord
from .shapes import Check, Memory, Setup, SharedGpu, Soak, Traffic, binomial_upper

PAYLOAD_OF = {"dispatch": "dispatch", "combine": "combine"}  # phase -> bytes it moves
BUDGET = "BUDGET"            # a soak its time budget ended with no call corrupted (dispatch exits 3)
SETUP_SHARED = "ranks share GPUs: each rank's setup competes with the others' for the GPU (functional figures)"
SHARED_NOTE = ("EP ranks are processes sharing GPUs (gloo group, CUDA IPC on one device); their kernels "
               "time-slice, so times are functional only, never performance figures")


def phase_traffic(spec, phase: str, dedup: bool, t, timing: dict | None, measured, gpu: str | None) -> Traffic:
    """The byte rule's figures of one phase; GB/s and the fractions of the ceilings when it was timed."""
    w = spec.workload
    carries = PAYLOAD_OF.get(phase)
    if carries is None:      # e.g. DeepEP's layout: metadata only, no payload, so no bytes and no GB/s
        return Traffic(note=f"the {phase} phase moves no payload: no bytes, no GB/s")
    b = traffic.phase_bytes(t, w, carries, dedup)
    tr = Traffic(**b, upstream=traffic.upstream_bytes(t, w, carries))
    if not timing:
        return tr
    for k, v in traffic.bandwidth(b, timing["median_us"] * 1e-6).items():
        setattr(tr, k, v)
    nominal = ceilings.ceiling_for(gpu, b["net_bytes"], spec.ceiling_gbps, node_net_ceiling() if b["net_bytes"] else None)
    tr.ceiling_GBps, tr.ceiling_source = nominal["ceiling_GBps"], nominal["ceiling_source"]
    if tr.ceiling_GBps and b["bus_bytes"]:
        tr.frac_of_ceiling = tr.busbw_GBps / tr.ceiling_GBps
    if measured:
        tr.measured_ceiling_GBps = measured[1]
        tr.frac_of_measured = tr.busbw_GBps / measured[1]
    return tr


def build(spec, name: str, dedup: bool, res, t, measured, argv: list[str], start: str,
          repeat: dict | None = None) -> list[dict]:
    """The records of one backend's result `res` (harness/runner.RankResult). spec: the run's RunSpec; repeat:
    shapes.Repeat's dict, with --repeats."""
    w = spec.workload
    prov = provenance.provenance()
    gpu = prov.get("gpu") if not spec.functional else None     # no ceiling fraction for functional runs
    phases = res.phases or {"dispatch": None, "combine": None}
    shared = SharedGpu(spec.ranks_per_gpu, res.bypassed or [], SHARED_NOTE) if spec.ranks_per_gpu > 1 else None
    mem = Memory.of(res.memory, shared is not None)
    setup = Setup.of(res.setup, SETUP_SHARED if shared else None)
    fault = res.fault.asdict() if res.fault is not None else None
    recs = []
    for phase, timing in phases.items():
        check = Check(res.status, res.error or None, res.crash,
                      res.native_bytes if phase == "dispatch" else None)
        recs.append(DispatchRecord(
            argv=argv, repro=provenance.repro_command(argv, "moebench.dispatch"), workload=w.asdict(),
            device=spec.device, backend={"name": name, "version": res.version, "knobs": res.knobs, "dedup": dedup},
            phase=phase, timing=timing, traffic=phase_traffic(spec, phase, dedup, t, timing, measured, gpu).asdict(),
            kernels=res.kernels.get(phase), views=res.views.get(phase), overlap=res.overlap.get(phase),
            check=check.asdict(), env=prov, start_utc=start, end_utc=provenance.utc_now(),
            functional=spec.functional, shared_gpu=shared.asdict() if shared else None,
            memory=mem.asdict() if mem else None, setup=setup.asdict() if setup else None, fault=fault,
            repeat=repeat, **{f"{k}_sha256": v for k, v in (res.inputs_sha256 or {}).items()}).asdict())
    return recs


REFUSED = "REFUSED"          # a sweep's case the preflight refused before any rank started (records/matrix.py)


def refused(spec, name: str, why: str, argv: list[str], sweep: dict | None = None) -> list[dict]:
    """The records of a case refused before any work (a sweep keeps them: the capability matrix shows the cell):
    one per phase, nothing timed, nothing counted (a refused shape may be too large even to draw its routing)."""
    start, prov = provenance.utc_now(), provenance.provenance()
    return [DispatchRecord(
        argv=argv, repro=provenance.repro_command(argv, "moebench.dispatch"), workload=spec.workload.asdict(),
        device=spec.device, backend={"name": name, "knobs": spec.backend_knobs}, phase=phase, timing=None,
        traffic=Traffic(note="refused before any rank started: nothing moved").asdict(), check=Check(REFUSED, why).asdict(),
        env=prov, start_utc=start, end_utc=start, functional=spec.functional, sweep=sweep).asdict()
        for phase in PAYLOAD_OF]


def soak_of(asked: int, ranks: list[dict], error: str | None, crash: str | None, budget_s: float = 0.0,
            every: int = 0) -> Soak:
    """One Soak from every rank's counts (harness/soak.py): a call is corrupted when any rank saw it wrong. A soak
    its time ended (--soak-seconds, or --timeout while its calls still advanced) has `budget`, not `stopped`.
    every: --soak-recreate (the backend rebuilt every `every` calls)."""
    done = min((r.get("done", 0) for r in ranks), default=0)
    bad_ids = sorted({i for r in ranks for i in r.get("bad_calls", [])})
    k = len(bad_ids)
    graph = next((r["graph"] for r in ranks if r.get("graph")), None)
    if k:
        summary = f"{k} of {done} calls corrupted ({100 * k / max(done, 1):.2g}%)"
    else:
        summary = f"0 of {done}: < {100 * binomial_upper(0, done):.2g}% at 95%"
    stopped = budget = None
    if crash == "timeout":
        budget = {"by": "--timeout", "calls": done, "error": error}
    elif error or any(r.get("error") for r in ranks):
        why = error or next(r["error"] for r in ranks if r.get("error"))
        stopped = {"call": done, "how": crash or "error", "error": why}
    elif done < asked or (graph or {}).get("budget") is not None:
        budget = {"by": "--soak-seconds", "seconds": budget_s, "calls": done}
    if budget:
        summary += f"; {done} of {asked} calls when {budget['by']} ran out"
    bad = sorted((b for r in ranks for b in r.get("bad", [])), key=lambda b: (b["call"], b["rank"]))
    return Soak(calls=done, asked=asked, corrupted_calls=k, corrupted_rows=sum(r.get("rows", 0) for r in ranks),
                corrupted_tokens=sum(r.get("tokens", 0) for r in ranks), first_bad_call=bad_ids[0] if k else None,
                bad=bad[:20], upper_95=binomial_upper(k, done), summary=summary, graph=graph, stopped=stopped,
                budget=budget, stage_ms=_stage_ms(ranks, done), checked_on=next(
                    (r["checked_on"] for r in ranks if r.get("checked_on")), None), rebuilt=_rebuilt(ranks, every))


def _rebuilt(ranks: list[dict], every: int) -> dict | None:
    """--soak-recreate's rebuilds: how many, and their ms (each the slowest rank's)."""
    per = [r.get("rebuild_ms") or [] for r in ranks]
    n = min(map(len, per), default=0)
    if not every:
        return None
    ms = sorted(max(p[i] for p in per) for i in range(n))
    return {"every": every, "count": n, "median_ms": ms[len(ms) // 2] if ms else None, "max_ms": ms[-1] if ms else None}


def _stage_ms(ranks: list[dict], done: int) -> dict | None:
    """Milliseconds per call of each stage of a checked call, the slowest rank's (harness/soak.py STAGES)."""
    if not done:
        return None
    stages = {k for r in ranks for k in (r.get("stage_s") or {})}
    return {k: round(max((r.get("stage_s") or {}).get(k, 0.0) for r in ranks) * 1e3 / done, 3)
            for k in sorted(stages)} or None


def soak_verdict(s: Soak) -> tuple[str, str]:
    """(PASS | FAIL | BUDGET, why): any corrupted call or replay, or a soak stopped by a crash, a hang or an error,
    is FAIL; one its time budget ended with none corrupted is BUDGET (exit 3: the bound holds over the calls
    made, fewer than asked); else PASS."""
    why = []
    if s.corrupted_calls:
        first = s.bad[0] if s.bad else {}
        where = ", ".join(f"expert {e}: {n} row(s)" for e, n in first.get("rows", [])[:4])
        toks = first.get("tokens")
        why.append(f"soak: {s.summary}; first at call {s.first_bad_call} on rank {first.get('rank')}"
                   + (f" ({where})" if where else "") + (f", tokens {toks}" if toks else "")
                   + (f", {first['error']}" if first.get("error") else ""))
    g = s.graph or {}
    if g.get("corrupted"):
        why.append(f"graph replays: {g['corrupted']} of {g['replays']} wrong, first {g['first'][0]}")
    if s.stopped:
        why.append(f"soak stopped at call {s.stopped['call']} of {s.asked} ({s.stopped['how']}): {s.stopped['error']}")
    if why:
        return "FAIL", "; ".join(why)
    if s.budget:
        return BUDGET, f"soak: {s.summary}" + (f"; graph: {g['replays']} replays" if "replays" in g else "")
    return "PASS", ""


def build_soak(spec, name: str, dedup: bool, ranks: list[dict], error, crash, argv: list[str],
               start: str) -> list[dict]:
    """The soak's record (phase "soak"): its counts, PASS or FAIL with the calls and rows named."""
    s = soak_of(spec.soak, ranks, error, crash, spec.soak_seconds, spec.soak_recreate)
    status, why = soak_verdict(s)
    first = next((r for r in ranks if r.get("knobs") is not None), {})       # rank 0's where it got that far
    shared = SharedGpu(spec.ranks_per_gpu, first.get("bypassed") or [], SHARED_NOTE) if spec.ranks_per_gpu > 1 else None
    return [DispatchRecord(
        argv=argv, repro=provenance.repro_command(argv, "moebench.dispatch"), workload=spec.workload.asdict(),
        device=spec.device, backend={"name": name, "knobs": first.get("knobs") or {}, "dedup": dedup}, phase="soak",
        timing=None,
        traffic=Traffic(note="a soak checks outputs; it is not timed").asdict(),
        check=Check(status, why or None, crash).asdict(), env=provenance.provenance(), start_utc=start,
        end_utc=provenance.utc_now(), functional=spec.functional, shared_gpu=shared.asdict() if shared else None,
        soak=s.asdict()).asdict()]
