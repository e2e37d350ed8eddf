"""One case, one backend: check against the oracle on every rank, then time each phase.

Each backend runs in its own launch of rank processes, so one that crashes or hangs is reported
FAIL and the next backend still runs. Rank results come back to the parent, which applies the
byte rule (traffic.py) and builds the JSONL records (records/schema.DispatchRecord).
"""
from __future__ import annotations

import functools
import traceback

import torch

from ..backends import base
from ..core import ceilings, reference, traffic
from ..core.workload import Workload, WorkloadError, make_routing, rank_inputs
from ..env.transport import network_ceiling
from ..records import provenance
from ..records.schema import PHASES, DispatchRecord
from . import overlap, preflight, views
from .launch import LaunchError, RankContext, environment, run_ranks
from .spec import RunSpec
from .timing import Timer, agree_error, measure_alltoall


def _result(status: str, error: str = "") -> dict:
    """A backend's result as rank_main returns it; status FAIL/WAIVED before anything was timed."""
    return {"status": status, "error": error, "phases": {}, "knobs": {}, "version": "", "a2a": None}


class CheckFailed(Exception):
    """The backend ran but returned wrong tokens: the oracle's message."""


WAIVED = "WAIVED: "
PAYLOAD_OF = {"dispatch": "dispatch", "combine": "combine"}  # phase -> bytes it moves
NOT_ASKED = "not asked for (--views leaves {} out)"
SHARED_NOTE = ("EP ranks are processes sharing GPUs (gloo group, CUDA IPC on one device); their kernels "
               "time-slice, so times are functional only, never performance figures")


def _stage(fn, group) -> str:
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


def rank_main(ctx: RankContext, spec: RunSpec, name: str, measure: bool,
              rank_bytes: list[float] | None = None) -> dict:
    """Runs on every rank. Returns {status, error, phases: {phase: Stats dict}, views, knobs, a2a}.
    rank_bytes: moebench's received dispatch bytes per rank, asserted against the backend's own rule."""
    out = _result("FAIL")
    dev, w = ctx.device, spec.workload
    b = None
    x, idx, wt, q, s = rank_inputs(w, ctx.rank, dev)
    payload = q if q is not None else x

    def prepare():
        nonlocal b
        cls = base.get(name)
        out["version"] = cls.version()
        b = cls(knob_values=spec.backend_knobs, shared_gpu=ctx.ranks_per_gpu > 1)
        b.validate(w, ctx.world)
        b.setup(ctx.group, w, dev)
        out["knobs"] = b.knobs()

    checked = {}

    def check():
        msg, checked["d"], checked["y"] = _check(b, w, ctx.rank, payload, idx, wt, s, dev)
        if msg:
            raise CheckFailed(msg)
        native = b.native_bytes(checked["d"])
        if native is not None and rank_bytes is not None:
            out["native_bytes"] = {"backend": native, "moebench": rank_bytes[ctx.rank]}
            if native != rank_bytes[ctx.rank]:
                raise CheckFailed(f"byte rule: rank {ctx.rank} received {native} bytes by {name}'s own count "
                                  f"(recv_x.numel() x element size), {rank_bytes[ctx.rank]} by moebench/1")

    err = _stage(prepare, ctx.group) or _stage(check, ctx.group)
    out["bypassed"] = list(b.bypassed) if b else []
    if err:
        _teardown(b)
        waived = err.startswith(WAIVED)
        out.update(status="WAIVED" if waived else "FAIL", error=err.removeprefix(WAIVED))
        return out
    timer = Timer(dev, ctx.group, spec.flush_l2)
    _time(b, out, timer, ctx, spec, payload, idx, wt, s, checked["d"], checked["y"])
    if measure:
        bytes_per_rank = w.num_tokens * w.topk * w.bytes_per_token
        out["a2a"] = measure_alltoall(timer, ctx.group, dev, bytes_per_rank, spec.iters)
    b.teardown()
    out.update(status="FAIL" if out.get("graph_fail") else "PASS", error=out.pop("graph_fail", ""), knobs=b.knobs())
    return out


def _time(b, out, timer, ctx, spec: RunSpec, payload, idx, wt, s, d, y) -> None:
    """Every phase in the api view; dispatch and combine also in the cached and kernel views, and
    under a concurrent GEMM with --overlap. The checked dispatch's handle serves the timed combines."""
    phases = {"dispatch": lambda: b.dispatch(payload, idx, wt, s), "combine": lambda: b.combine(y, d.handle)}
    phases.update(b.extra_phases(payload, idx, wt))
    cached = b.cached_phases(payload, idx, wt, s, d, y)
    gemm = None
    if spec.overlap:
        gemm = overlap.Gemm(overlap.gemm_shape(overlap.parse(spec.overlap), d.x_RH.shape[0], spec.workload.hidden),
                            ctx.device)
    for phase, fn in phases.items():
        st = timer.run(fn, spec.iters, spec.warmup_ms)
        out["phases"][phase] = st.asdict()
        v = out.setdefault("views", {})[phase] = {"api": {"median_us": st.median_us, "aggregation": views.API_AGG}}
        rows = views.profile(fn, timer) if (timer.cuda or spec.profile) else None
        if rows is not None:
            out.setdefault("kernels", {})[phase] = rows[:views.KERNEL_ROWS]
            if timer.cuda:
                out["phases"][phase].update(views.host_split(st.median_us, rows))
        if phase not in PHASES:
            continue
        if "kernel" not in spec.views:
            v["kernel"] = views.none(NOT_ASKED.format("kernel"))
        elif not timer.cuda:
            v["kernel"] = views.none("CPU run: no GPU kernels")
        elif not b.comm_kernels:
            v["kernel"] = views.none(f"{b.name} names no communication kernels")
        else:
            v["kernel"] = views.kernel(timer, rows, b.comm_kernels, ctx.rank)
        v["cached"] = (views.none(NOT_ASKED.format("cached")) if "cached" not in spec.views else
                       views.cached(timer, cached[phase], spec.iters, spec.warmup_ms, ctx.rank) if phase in cached
                       else views.none(b.no_cached_view))
        if gemm is not None:
            out.setdefault("overlap", {})[phase] = overlap.measure(timer, fn, gemm, st.median_us, spec.iters,
                                                                   spec.warmup_ms)
    _graph(b, out, timer, ctx, spec, payload, idx, wt, s, d, y)


def _graph(b, out, timer, ctx, spec: RunSpec, payload, idx, wt, s, d, y) -> None:
    """The graph view of dispatch and combine, last (a capture that goes wrong can leave nothing else
    untimed); a replay whose outputs fail the oracle makes the backend FAIL."""
    w = spec.workload
    if "graph" not in spec.views:
        g = {p: views.none(NOT_ASKED.format("graph")) for p in PHASES}
    else:
        plan = b.graph_plan(payload, idx, wt, s, d, y) if timer.cuda else "CPU run: no CUDA graphs"
        check = lambda dg, yg: (_dispatch_error(dg, w, ctx.rank, ctx.device)  # noqa: E731
                                or _combine_error(yg, payload, idx, wt, w, s))
        g = views.graph(timer, plan, spec.iters, ctx.rank, check, wait_s=min(120.0, spec.timeout_s / 4),
                        calls=spec.graph_calls)
    for phase in PHASES:
        out["views"][phase]["graph"] = g[phase]
        if g[phase].get("median_us") is not None:
            # to the nanosecond: two equal medians read 0, not float noise such as 1.4e-14
            api = out["phases"][phase]["median_us"]
            out["phases"][phase]["api_minus_graph_us"] = round(api - g[phase]["median_us"], 3)
    if "fail" in g["dispatch"]:
        out["graph_fail"] = f"graph view: {g['dispatch']['fail']}"


def _teardown(b) -> None:
    """Release a backend's buffers after a failure too (DeepEP's destructor may hang otherwise)."""
    try:
        if b is not None:
            b.teardown()
    except Exception:  # noqa: BLE001 - the failure already reported is the one that matters
        traceback.print_exc()


def _expert_outputs(d: base.Dispatched, rank: int, w: Workload) -> torch.Tensor:
    """The correctness experts applied to the dispatched rows, zero rows for any padding past them."""
    tpe = [int(c) for c in d.tokens_per_expert]
    y = reference.apply_experts(d.x_RH[: sum(tpe)], tpe, rank, w, d.scales_RS)
    rows = d.x_RH.shape[0]
    return y if y.shape[0] == rows else torch.cat([y, y.new_zeros(rows - y.shape[0], *y.shape[1:])])


def _dispatch_error(d: base.Dispatched, w, rank, dev) -> str:
    """'' when each local expert received exactly the oracle's rows, else the first difference."""
    exp_rows, exp_scales = reference.expected_dispatch(w, rank, dev)
    tpe = [int(c) for c in d.tokens_per_expert]
    got_rows = reference.split_rows(d.x_RH, tpe)
    got_scales = reference.split_rows(d.scales_RS, tpe) if d.scales_RS is not None else None
    err = reference.check_dispatch(got_rows, got_scales, exp_rows, exp_scales, rank, w)
    return "dispatch: " + err if err else ""


def _combine_error(out, payload, idx, wt, w, scales) -> str:
    err = reference.check_combine(out, reference.expected_combine(payload, idx, wt, w, scales))
    return "combine: " + err if err else ""


def _check(b, w, rank, payload, idx, wt, scales, dev):
    """(error or '', the dispatch, the expert outputs combined from it)."""
    d = b.dispatch(payload, idx, wt, scales)
    err = _dispatch_error(d, w, rank, dev)
    if err:
        return err, d, None
    y = _expert_outputs(d, rank, w)
    return _combine_error(b.combine(y, d.handle), payload, idx, wt, w, scales), d, y


def run_backend(spec: RunSpec, name: str, measure: bool, rank_bytes: list[float] | None = None) -> dict:
    """Launch the ranks for one backend; a crash or timeout becomes a FAIL result."""
    try:
        outs = run_ranks(rank_main, spec.workload.ep, spec.device, spec.timeout_s,
                         args=(spec, name, measure, rank_bytes), ranks_per_gpu=spec.ranks_per_gpu)
    except LaunchError as e:
        return {**_result("FAIL", str(e).splitlines()[0][:500]), "crash": e.crash}
    return outs[0] if outs else {}


def run_case(spec: RunSpec, argv: list[str] | None = None, progress=print, sink=None) -> list[dict]:
    """Every backend of the spec on its workload; returns the JSONL records (rank 0's view).
    argv: the command line to record (default: the spec's own, `spec.to_argv()`).
    sink(name, records): called as each backend finishes, with its records (the tools write them then)."""
    w = spec.workload
    argv = spec.to_argv() if argv is None else argv
    t = traffic.traffic_of([make_routing(w, r)[0] for r in range(w.ep)], w)
    rank_bytes = (t.pairs_SD.sum(0).double() * w.bytes_per_token).tolist()
    recs, measured = [], None
    for name in spec.backends:
        start = provenance.utc_now()
        why = waiver(name, spec)
        if why:
            res = _result("WAIVED", why)
        else:
            progress(f"# running {name} on EP {w.ep} ...")
            measure = spec.measure_ceiling and not spec.functional and measured is None   # NCCL only
            with environment(spec.env):
                res = run_backend(spec, name, measure=measure, rank_bytes=rank_bytes)
            measured = measured or res.get("a2a")
        if not res:
            continue
        mine = build_records(spec, name, res, t, measured, argv, start)
        if sink is not None:
            sink(name, mine)
        recs += mine
    return recs


def waiver(name: str, spec: RunSpec) -> str:
    """Why a backend is WAIVED before any rank starts ('' when it runs): its package is missing, or
    it cannot take this shape (with `--backend all`; a named backend that cannot is bad input)."""
    cls = base.get(name)
    ok, why = cls.available()
    if not ok:
        return why
    try:
        cls(knob_values=spec.backend_knobs).validate(spec.workload, spec.workload.ep)
    except WorkloadError as e:
        return f"cannot take this run: {e}"
    return preflight.waiver(name, spec)      # pre-launch checks: CUDA-only backends, memory (preflight.py)


@functools.lru_cache(maxsize=1)
def net_ceiling() -> tuple[float, str] | None:
    """This node's per-GPU network ceiling from its RDMA ports (sysfs), shared by the GPUs on their NUMA node."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    bus = [f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0" for p in props
           if hasattr(p, "pci_bus_id")]
    return network_ceiling(bus_ids=bus or None, ngpu=max(1, n))


def build_records(spec: RunSpec, name, res, t, measured, argv, start) -> list[dict]:
    w = spec.workload
    prov = provenance.provenance()
    gpu = prov.get("gpu") if not spec.functional else None     # no ceiling fraction for functional runs
    cls = base.get(name)
    phases = res["phases"] or {"dispatch": None, "combine": None}
    recs = []
    for phase, timing in phases.items():
        carries = PAYLOAD_OF.get(phase)
        if carries is None:      # e.g. DeepEP's layout: metadata only, no payload, so no bytes and no GB/s
            b, rec_traffic = None, {"note": f"the {phase} phase moves no payload: no bytes, no GB/s"}
        else:
            b = traffic.phase_bytes(t, w, carries, cls.dedup)
            rec_traffic = dict(b)
            rec_traffic["upstream"] = traffic.upstream_bytes(t, w, carries)
        if timing and b:
            rec_traffic.update(traffic.bandwidth(b, timing["median_us"] * 1e-6))
            nominal = ceilings.ceiling_for(gpu, b["net_bytes"], spec.ceiling_gbps, net_ceiling() if b["net_bytes"] else None)
            rec_traffic.update(nominal)
            if nominal["ceiling_GBps"] and b["bus_bytes"]:
                rec_traffic["frac_of_ceiling"] = rec_traffic["busbw_GBps"] / nominal["ceiling_GBps"]
            if measured:
                rec_traffic["measured_ceiling_GBps"] = measured[1]
                rec_traffic["frac_of_measured"] = rec_traffic["busbw_GBps"] / measured[1]
        check = {"status": res["status"], "error": res.get("error") or None,
                 **({"crash": res["crash"]} if res.get("crash") else {}),
                 **({"native_bytes": res["native_bytes"]} if res.get("native_bytes") and phase == "dispatch" else {})}
        recs.append(DispatchRecord(
            argv=argv, repro=provenance.repro_command(argv, "moebench.dispatch"), workload=w.asdict(),
            device=spec.device, backend={"name": name, "version": res.get("version"), "knobs": res.get("knobs"),
                                         "dedup": cls.dedup},
            phase=phase, timing=timing, traffic=rec_traffic, kernels=res.get("kernels", {}).get(phase),
            views=res.get("views", {}).get(phase), overlap=res.get("overlap", {}).get(phase), check=check,
            env=prov, start_utc=start, end_utc=provenance.utc_now(), functional=spec.functional,
            shared_gpu=({"ranks_per_gpu": spec.ranks_per_gpu, "bypassed": res.get("bypassed") or [],
                         "note": SHARED_NOTE} if spec.ranks_per_gpu > 1 else None)).asdict())
    return recs
