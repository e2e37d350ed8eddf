"""A moebench.dispatch record from one backend's rank result: the byte rule's traffic, GB/s against the
ceilings, the check, the views, the provenance. One record per phase (schema.DispatchRecord)."""
from __future__ import annotations

from ..core import ceilings, traffic
from ..env.transport import node_net_ceiling
from . import provenance
from .schema import DispatchRecord
from .shapes import Check, SharedGpu, Traffic

PAYLOAD_OF = {"dispatch": "dispatch", "combine": "combine"}  # phase -> bytes it moves
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


def build(spec, name: str, dedup: bool, res, t, measured, argv: list[str], start: str) -> list[dict]:
    """The records of one backend's result `res` (harness/runner.RankResult). spec: the run's RunSpec."""
    w = spec.workload
    prov = provenance.provenance()
    gpu = prov.get("gpu") if not spec.functional else None     # no ceiling fraction for functional runs
    phases = res.phases or {"dispatch": None, "combine": None}
    shared = SharedGpu(spec.ranks_per_gpu, res.bypassed or [], SHARED_NOTE) if spec.ranks_per_gpu > 1 else None
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
            functional=spec.functional, shared_gpu=shared.asdict() if shared else None).asdict())
    return recs
