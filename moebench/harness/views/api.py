"""api: what a training step pays for one call (layout, metadata, host waits, the local permute): a
barrier before each call, the L2 flush queued before it, CUDA events around it (CPU: host clock), the
per-iteration max over ranks, the median. Every phase of the backend (its extra ones too, e.g. DeepEP's
layout); its times are the record's `timing`. On CUDA (or with --profile) each phase's kernels are
profiled too: the record's `kernels`, the host split, and what the kernel view reads."""
from __future__ import annotations

from ...records.shapes import Tails, field_names
from . import Case, figure
from .profile import host_split, profile

NAME, ORDER, SAMPLED = "api", 0, True
ABOUT = "the call a training step makes"
AGG = "median over iterations of the per-iteration max over ranks, a barrier before each call"


def run(case: Case) -> dict:
    timer, spec, out = case.timer, case.spec, {}
    for phase, fn in case.phases.items():
        injected = case.fault(fn) if case.fault and phase == "dispatch" else None   # --inject's fault, timed calls
        st = timer.run(fn, spec.iters, spec.warmup_ms, timed=injected)
        case.stats[phase] = st
        case.timing[phase] = st.asdict()
        prof = profile(fn, timer, flushed=True) if (timer.cuda or spec.profile) else None   # the cache state timed
        if prof is not None:
            case.rows[phase] = prof.rows
            if timer.cuda:
                case.timing[phase].update(host_split(st.median_us, prof))
        tails = {k: v for k, v in st.asdict().items() if k in field_names(Tails)}
        out[phase] = figure(st.median_us, st.median_us, AGG, st.samples_us, iters=st.iters, **tails)
    return out
