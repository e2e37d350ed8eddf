"""From moebench.dispatch results to a Megatron decision: the winner of a matched A/B, and its flags.

Winner rule (per workload: same shape, routing, EP, dtype, seed and device). The control is
`alltoall`; a candidate (`deepep`, `hybridep`) replaces it only when its dispatch+combine time
beats the control's by more than the measured noise:

    gain_us  = control.median - candidate.median                       (phases summed)
    noise_us = (control.median - control.p10) + (candidate.p90 - candidate.median)
    win      = gain_us > noise_us  and  gain_us > min_gain * control.median

i.e. the candidate's p90 is below the control's p10. Where the file holds repeats of both (dispatch --repeats N:
fresh processes, the order rotated) the A/B is over them instead, paired by repeat (records/repeats.py): the
candidate wins when the whole 95% bootstrap interval of its time over the control's lies below 1 and it saves
more than min_gain; the output names which noise it used. Among winners the largest gain is taken.
Otherwise `alltoall` stays, with the reason. Megatron-path results (`mcore-*`, the exact code a
training step runs) are preferred to the raw backends when both a control and a candidate passed
there; the two families are never mixed in one A/B. Only records whose check PASSed count.

A candidate is not eligible, with the reason, where the A/B is no evidence for it: a flex backend at
EP 1 (Megatron's flex dispatcher needs TP x EP > 1), HybridEP in an FP8 A/B on megatron-core <= 0.19
(it cannot dispatch FP8 there), or records from another kind of machine than the control's (GPU model
or count, NCCL or driver differ: refused, the difference named). Balanced (forced-balance) routing gives
a decision labelled benchmark-only.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from ..core import megatron_map
from ..core.megatron_map import BACKENDS, CONTROL
from ..harness.spec import ENV_KNOB
from ..records import repeats, schema
from ..records.schema import PHASES, env_difference
from ..records.tables import fit
from .flags import megatron_flags, parse_version

FORCED_BALANCE_NOTE = ("benchmark-only: balanced routing forces every expert the same load (as "
                       "--moe-router-force-load-balancing does); never a training-equivalent verdict")


@dataclass
class Summary:
    """One backend's matched record set: dispatch+combine times summed over phases."""
    name: str
    status: str                       # PASS | FAIL | WAIVED | INCOMPLETE
    error: str = ""
    median_us: float = 0.0
    p10_us: float = 0.0
    p90_us: float = 0.0
    knobs: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)           # the allowlisted environment variables of the run
    prov: dict = field(default_factory=dict)          # the record's provenance (GPU, NCCL, driver, sha)
    footprint_bytes: int | None = None                # the backend's memory at this shape (largest rank)


def workload_key(rec: dict) -> str:
    return json.dumps({"workload": rec.get("workload"), "device": rec.get("device")}, sort_keys=True)


def summarize(records: list[dict], view: str = "api") -> dict[str, Summary]:
    """name -> Summary over the dispatch and combine phases in one timing view (the last record of each
    phase wins)."""
    last: dict[str, dict[str, dict]] = {}
    for r in records:
        last.setdefault(schema.name(r), {})[r["phase"]] = r
    out = {}
    for name, phases in last.items():
        recs = [phases.get(p) for p in PHASES]
        any_rec = next(r for r in phases.values())
        s = Summary(name, schema.status(any_rec), schema.error(any_rec),
                    knobs=any_rec["backend"].get("knobs") or {}, env=(any_rec.get("env") or {}).get("env") or {},
                    prov=any_rec.get("env") or {},
                    footprint_bytes=schema.largest_footprint(phases.values()))
        if s.status == "PASS":
            ts = [schema.view_timing(r, view) if r else None for r in recs]
            if not all(ts):
                s.status, s.error = "INCOMPLETE", f"no timed dispatch and combine records in the {view} view"
            elif any(t.get(k) is None for t in ts for k in ("p10_us", "p90_us")):
                s.status, s.error = "INCOMPLETE", f"no p10/p90 spread in the {view} view: its noise is unknown"
            elif not all(0 < t["p10_us"] <= t["median_us"] <= t["p90_us"] < math.inf for t in ts):
                s.status, s.error = "REFUSED", f"impossible times in the {view} view (records/reader.py refuses them)"
            else:
                for key in ("median_us", "p10_us", "p90_us"):
                    setattr(s, key, sum(float(t[key]) for t in ts))
        out[name] = s
    return out


def compare(control: Summary, cand: Summary, min_gain: float = 0.0, paired: list | None = None) -> dict:
    """The candidate against the control: over `paired` (control us, candidate us) repeats where the file has them
    (records/repeats.py), else by the p10/p90 spread of their last runs."""
    if paired:
        return compare_repeats(control, cand, min_gain, paired)
    gain = control.median_us - cand.median_us
    noise = (control.median_us - control.p10_us) + (cand.p90_us - cand.median_us)
    wins = gain > noise and gain > min_gain * control.median_us
    if wins:
        why = f"faster by {gain:.1f} us ({100 * gain / control.median_us:.1f}%), more than the noise {noise:.1f} us"
    elif gain <= 0:
        why = f"slower than {control.name} by {-gain:.1f} us"
    elif gain <= noise:
        why = f"gain {gain:.1f} us is within the measured noise {noise:.1f} us"
    else:
        why = f"gain {gain:.1f} us is below the required {100 * min_gain:.1f}% of {control.name}"
    mem = None
    if cand.footprint_bytes is not None and control.footprint_bytes is not None:
        mem = cand.footprint_bytes - control.footprint_bytes
    return {"name": cand.name, "status": cand.status, "median_us": cand.median_us, "p10_us": cand.p10_us,
            "p90_us": cand.p90_us, "gain_us": gain, "noise_us": noise, "wins": wins, "why": why,
            "noise": NOISE_ONE_RUN, "footprint_bytes": cand.footprint_bytes, "footprint_delta_bytes": mem}


NOISE_ONE_RUN = "p10/p90 of one run's iterations (not independent samples: dispatch --repeats N gives repeats)"


def compare_repeats(control: Summary, cand: Summary, min_gain: float, paired: list) -> dict:
    """The A/B over repeats, paired: the candidate wins when the whole 95% interval of its time over the control's
    (records/repeats.interval) lies below 1 and it saves more than min_gain; medians are over the repeats."""
    ratio, lo, hi = repeats.interval(paired)
    c_us, k_us = (float(statistics.median(p[i] for p in paired)) for i in (0, 1))
    wins = hi < 1.0 and 1.0 - ratio > min_gain
    ab = f"candidate / {control.name} {ratio:.3f} (95% {lo:.3f}-{hi:.3f}, {repeats.method(len(paired))})"
    if wins:
        why = f"faster by {100 * (1 - ratio):.1f}%: {ab}"
    elif ratio >= 1.0:
        why = f"not faster than {control.name}: {ab}"
    elif hi >= 1.0:
        why = f"the gain is within the noise of the repeats: {ab}"
    else:
        why = f"gain {100 * (1 - ratio):.1f}% is below the required {100 * min_gain:.1f}%: {ab}"
    mem = (cand.footprint_bytes - control.footprint_bytes
           if cand.footprint_bytes is not None and control.footprint_bytes is not None else None)
    return {"name": cand.name, "status": cand.status, "median_us": k_us, "p10_us": min(p[1] for p in paired),
            "p90_us": max(p[1] for p in paired), "gain_us": c_us - k_us, "ratio": ratio, "ci_low": lo, "ci_high": hi,
            "repeats": len(paired), "wins": wins, "why": why, "noise": repeats.method(len(paired)),
            "footprint_bytes": cand.footprint_bytes, "footprint_delta_bytes": mem}


def decide(records: list[dict], min_gain: float = 0.0, view: str = "api", version: str | None = None) -> dict:
    """The A/B for one workload's records in one timing view: {view, family, control, candidates, winner,
    reason, labels, notes}."""
    sums = summarize(records, view)
    w = (records[0].get("workload") if records else None) or {}
    notes = eligibility(sums, w, version)
    fam = _pick_family(sums)
    out = {"view": view, "family": fam, "control": None, "candidates": [], "winner": CONTROL, "winner_record": None,
           "labels": [FORCED_BALANCE_NOTE] if str(w.get("routing", "")).startswith("balanced") else [],
           "notes": notes}
    if fam is None:
        seen = ", ".join(f"{n} {s.status}" + (f" ({s.error})" if s.status in ("NOT ELIGIBLE", "REFUSED") else "")
                         for n, s in sums.items()) or "no records"
        out["reason"] = ("keep alltoall: no matched A/B (it needs a passing alltoall control and a passing "
                         f"candidate of the same family, raw or mcore-*; measured: {seen})")
        controls = {control for control, _ in megatron_map.families().values()}
        out["candidates"] = [_ineligible(s) for n, s in sums.items() if n not in controls]
        return out
    control_name, cands = megatron_map.families()[fam]
    control = sums[control_name]
    rep = {n: repeats.totals([r for r in records if schema.name(r) == n], view) for n in (control_name, *cands)}
    out["control"] = {"name": control.name, "median_us": control.median_us, "p10_us": control.p10_us,
                      "p90_us": control.p90_us, "footprint_bytes": control.footprint_bytes}
    over = [us for us, _ in rep[control_name].values()]
    if len(over) >= repeats.MIN_PAIRS:         # the control over its repeats, as the candidates are judged
        out["control"].update(median_us=statistics.median(over), p10_us=min(over), p90_us=max(over), repeats=len(over))
    best = None
    for name in cands:
        if name not in sums:
            out["candidates"].append({"name": name, "status": "MISSING", "wins": False, "why": "not measured"})
        elif sums[name].status != "PASS":
            out["candidates"].append(_ineligible(sums[name]))
        else:
            c = compare(control, sums[name], min_gain, repeats.pairs(rep[control_name], rep[name]))
            out["candidates"].append(c)
            if c["wins"] and (best is None or c["gain_us"] > best["gain_us"]):
                best = c
    if best:
        out["winner"], out["winner_record"] = cands[best["name"]], best["name"]
        out["reason"] = f"{best['name']} wins the A/B against {control_name} in the {view} view: {best['why']}"
    else:
        whys = "; ".join(f"{c['name']}: {c['why']}" for c in out["candidates"])
        out["reason"] = (f"keep alltoall: no candidate beat {control_name} by more than the noise in the {view} view "
                         f"({whys})")
    return out


def eligibility(sums: dict[str, Summary], w: dict, version: str | None) -> list[str]:
    """Mark the candidates an A/B is no evidence for (the rules above); returns notes (a differing sha)."""
    controls = {c for c, _ in megatron_map.families().values()}
    notes = []
    for name, s in sums.items():
        mb = BACKENDS.get(megatron_map.megatron_name(name))
        if name in controls or mb is None or s.status != "PASS":
            continue
        why = ""
        if mb.flex and int(w.get("ep") or 2) < 2:
            why = "flex needs TP x EP > 1 (Megatron asserts it): no candidate at EP 1"
        elif mb.name == "hybridep" and w.get("dtype") == "fp8" and version and parse_version(version) <= (0, 19):
            why = f"hybridep cannot dispatch FP8 on megatron-core {version}: this FP8 A/B is no evidence for it"
        control = sums.get(BACKENDS[CONTROL].mcore if name.startswith(megatron_map.MCORE_PREFIX) else CONTROL)
        if not why and control is not None:
            refuse, note = env_difference(control.prov, s.prov)
            notes += [f"{name}: {n}" for n in note]
            if refuse:
                s.status, why = "REFUSED", f"measured on another kind of machine than {control.name}: {', '.join(refuse)}"
        if why:
            s.status, s.error = ("REFUSED" if s.status == "REFUSED" else "NOT ELIGIBLE"), why
    return notes


def _pick_family(sums: dict[str, Summary]) -> str | None:
    for fam in ("mcore", "raw"):
        control, cands = megatron_map.families()[fam]
        if control in sums and sums[control].status == "PASS" and \
                any(sums[c].status == "PASS" for c in cands if c in sums):
            return fam
    return None


def _ineligible(s: Summary) -> dict:
    why = s.status + (f": {s.error}" if s.error else "")
    return {"name": s.name, "status": s.status, "wins": False, "why": f"not eligible ({why})"}


def decisions_from_results(records: list[dict], version: str, overlap: bool = False, num_sms: int | None = None,
                           min_gain: float = 0.0, view: str = "api", capacity_factor: float = 1.5) -> list[dict]:
    """One decision (A/B + flags) per matched workload group in a results file."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        if isinstance(r, dict) and {"workload", "backend", "phase", "check"} <= r.keys():
            groups.setdefault(workload_key(r), []).append(r)
    out = []
    for key, recs in groups.items():
        recs, best = _best_setting_only(recs)
        d = decide(recs, min_gain, view, version)
        w = recs[0]["workload"]
        sums = summarize(recs, view)
        sms, zero_copy = num_sms, True
        env_domain = None
        if d["winner_record"]:
            won = sums[d["winner_record"]]
            sms = sms if sms is not None else _knob_sms(won.knobs)
            zero_copy = bool(won.knobs.get("zero_copy"))        # records older than the knob were timed without
            domain_env = BACKENDS[d["winner"]].domain_env
            env_domain = won.env.get(domain_env) if domain_env else None
        domain = _count(env_domain) or min(w["ep"], w.get("gpus_per_node", w["ep"]))
        ov = _overlap_verdict(recs, d) if overlap else None
        flags = megatron_flags(d["winner"], version, sms if BACKENDS[d["winner"]].flex else None,
                               bool(ov and ov["on"]), ep=w["ep"], ranks_per_nvlink_domain=domain,
                               domain_found=w.get("gpus_per_node"), capacity_factor=capacity_factor,
                               zero_copy=zero_copy)
        if ov:
            flags.notes.insert(0, ("overlap on: " if ov["on"] else "overlap not emitted: ") + ov["why"])
        for k, v in best.get(d["winner_record"], {}).items():   # env knobs of the swept best setting
            if k.startswith(ENV_KNOB):
                flags.env[k[len(ENV_KNOB):]] = str(v)
        out.append({"workload": w, "device": recs[0].get("device"), **d, "flags": flags.asdict(),
                    **({"overlap": ov} if ov else {})})
    return out


def _overlap_verdict(recs: list[dict], d: dict) -> dict:
    """overlap_pays for the backend whose flags are emitted: the winner's records, else the
    control's (the Megatron path first)."""
    names = [d["winner_record"]] if d["winner_record"] else [f"mcore-{CONTROL}", CONTROL]
    verdicts = [overlap_pays(recs, n) for n in names]
    return next((v for v in verdicts if "hidden_us" in v), verdicts[0])


def _best_setting_only(recs: list[dict]) -> tuple[list[dict], dict[str, dict]]:
    """Where a knob sweep timed a backend at several settings, keep only its fastest setting
    (knobs.best_knobs: lowest dispatch + combine median), so the A/B and the flags use it."""
    from ..records.knobs import best_knobs
    from ..records.schema import knobs_of
    best = {b["backend"]: b["knobs"] for b in best_knobs(recs) if b["settings"] > 1}
    kept = [r for r in recs if schema.name(r) not in best or knobs_of(r) == best[schema.name(r)]]
    return kept, best


def _count(v) -> int | None:
    """A count a record gives as a JSON integer or a string of digits (environment values), else None."""
    if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 19:
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def _knob_sms(knobs: dict) -> int | None:
    keys = ("num_sms", "moe_flex_dispatcher_num_sms", "moe_deepep_num_sms", "moe_hybridep_num_sms")
    return next((n for k in keys if (n := _count(knobs.get(k))) is not None), None)


def format_decision(d: dict) -> str:
    """Human-readable block for one decision."""
    w = d.get("workload") or {}
    lines = []
    if w:
        lines.append(f"# workload: T={w.get('num_tokens')} H={w.get('hidden')} E={w.get('num_experts')} "
                     f"K={w.get('topk')} EP={w.get('ep')} dtype={w.get('dtype')} routing={w.get('routing')} "
                     f"device={d.get('device')}")
    if d.get("control"):
        c = d["control"]
        lines.append(f"#   control {c['name']}: {c['median_us']:.1f} us ({_spread(c)})" + _memory(c))
    for c in d.get("candidates", []):
        t = f"{c['median_us']:.1f} us ({_spread(c)}) " if "median_us" in c else ""
        lines.append(f"#   candidate {c['name']}: {t}{'WINS' if c.get('wins') else 'no'} - {c['why']}" + _memory(c))
    f = d["flags"]
    lines.append(f"# winner: {d['winner']} - {d['reason']}")
    noises = sorted({c["noise"] for c in d.get("candidates", []) if c.get("noise")})
    if noises:
        lines.append(f"# noise: {'; '.join(noises)}")
    lines.append(f"megatron-lm:     {f['megatron_lm_cmdline']}")
    lines.append(f"megatron-bridge: {' '.join(f['megatron_bridge'])}")
    lines.append(f"bridge-perf:     {f['bridge_perf_cmdline']}")
    if f["env"]:
        lines.append("env:             " + " ".join(f"{k}={v}" for k, v in f["env"].items()))
    lines += [f"# {x}" for x in d.get("labels") or []]
    lines += [f"# note: {n}" for n in [*(d.get("notes") or []), *f["notes"]]]
    return "\n".join(fit(lines))


def _spread(c: dict) -> str:
    """'p10 X, p90 Y' of one run, or 'median of N repeats, min-max' over repeats."""
    if c.get("repeats"):
        return f"median of {c['repeats']} repeats, {c['p10_us']:.1f}-{c['p90_us']:.1f}"
    return f"p10 {c['p10_us']:.1f}, p90 {c['p90_us']:.1f}"


def _memory(c: dict) -> str:
    """'; memory 5.28 GiB (+1.20 vs control)': the backend's footprint at this shape, where measured."""
    if c.get("footprint_bytes") is None:
        return ""
    delta = c.get("footprint_delta_bytes")
    return f"; memory {c['footprint_bytes'] / 2**30:.2f} GiB" + (f" ({delta / 2**30:+.2f} vs control)"
                                                                 if delta is not None else "")


def overlap_pays(records: list[dict], backend: str) -> dict:
    """Whether overlap pays for `backend`, from its PASS dispatch and combine records with overlap
    figures: {on, why, hidden_us, noise_us, ...}. It pays when the time it hides (comm alone -
    exposed, summed over both phases; the GEMM's slowdown is inside `exposed`) exceeds the noise
    (p90 - median of the overlapped and of the GEMM-alone times)."""
    last = {r["phase"]: r for r in records if schema.name(r) == backend and r.get("overlap")
            and schema.status(r) == "PASS" and r.get("phase") in ("dispatch", "combine")}
    if set(last) != {"dispatch", "combine"}:
        return {"on": False, "backend": backend,
                "why": f"no overlap figures for {backend}'s dispatch and combine: run moebench.dispatch --overlap gemm"}
    o = [last[p]["overlap"] for p in ("dispatch", "combine")]
    comm = sum(x["comm_alone_us"] for x in o)
    exposed = sum(x["exposed_us"] for x in o)
    noise = sum((x["overlapped_p90_us"] - x["overlapped_us"]) + (x["gemm_alone_p90_us"] - x["gemm_alone_us"]) for x in o)
    hidden = comm - exposed
    slow = max(x["gemm_slowdown"] for x in o)
    figures = (f"{backend}: dispatch+combine alone {comm:.1f} us, exposed beside the GEMM {exposed:.1f} us, "
               f"GEMM slowed up to {slow:.2f}x, noise {noise:.1f} us")
    if hidden > noise:
        why = f"overlap hides {hidden:.1f} us per dispatch+combine, more than the noise ({figures})"
    elif hidden <= 0:
        why = f"the GEMM's slowdown eats the gain: exposed time is not below the time alone ({figures})"
    else:
        why = f"the {hidden:.1f} us overlap would hide is within the noise ({figures})"
    return {"on": hidden > noise, "backend": backend, "why": why, "hidden_us": hidden, "noise_us": noise,
            "comm_alone_us": comm, "exposed_us": exposed, "gemm_slowdown": slow,
            "functional": any(schema.is_functional(last[p]) for p in last)}
