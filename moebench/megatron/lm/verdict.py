"""The verdict of a Megatron-LM validation: KEEP alltoall, SWITCH to the candidate, or INCONCLUSIVE.

Per arm and repeat, the steady window is Megatron's elapsed time per iteration over the last N logged
iterations (the reference validation averages the last 10 of 30). The ratio is candidate / control of
the mean over repeats of each repeat's window mean; its 95% interval comes from a two-level bootstrap
(repeats drawn with replacement, then each drawn repeat's iterations), so launch-to-launch noise counts
and one repeat cannot speak for itself. With gain = 1 - ratio and the user's --min-gain:

    SWITCH        the whole interval saves more than min_gain      (1 - ci_hi > min_gain)
    KEEP          not even its best end saves more than min_gain   (1 - ci_lo <= min_gain)
    INCONCLUSIVE  the interval straddles min_gain: repeat more, or run longer

Before speed is judged: every arm of both dispatchers must PASS (a crash, hang, NaN or skipped
iteration, or another dispatcher class than asked for FAILs the candidate); the candidate's loss curve
must match the control's, iteration by iteration, within a relative tolerance (same seed, same mock
data: the dispatchers move the same tokens; only reduction order may differ), else FAIL whatever the
speed; and both must come from one kind of machine (GPU model and count, NCCL, driver), else REFUSED
with the difference named. Shared-GPU and CPU arms give a verdict labelled functional; forced-balance
routing is labelled benchmark-only: neither is a training-equivalent verdict.
"""
from __future__ import annotations

import math
import random
import statistics

from ...core.megatron_map import CONTROL
from ...records.megatron import VerdictRecord, arm_problem
from ...records.provenance import utc_now
from ...records.schema import env_difference
from .args import LmError

FORCED_BALANCE = "--moe-router-force-load-balancing"


class VerdictInputError(LmError):
    """An arm record a verdict cannot be built on (its file and line named): one line, exit 2."""


def _where(rec: dict) -> str:
    return f"{rec.get('_file', '?')}:{rec.get('_line', '?')}"


def vet(arms: list[dict]) -> None:
    """VerdictInputError naming the first arm record a verdict cannot be built on (records.megatron.arm_problem)."""
    bad = next(((a, p) for a in arms if (p := arm_problem(a))), None)
    if bad:
        raise VerdictInputError(f"{_where(bad[0])}: {bad[1]}")


def samples(rec: dict) -> list[float]:
    """The steady-window samples of a PASS arm (vetted)."""
    return [float(v) for v in rec["steady"]["samples_ms"]]


def ratio_interval(ctrl: list[list[float]], cand: list[list[float]], draws: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """(ratio of means, 2.5th and 97.5th percentile) by the two-level bootstrap above."""
    def mean_of(groups):
        return statistics.fmean(statistics.fmean(g) for g in groups)

    rng = random.Random(seed)

    def draw(groups):
        picked = [groups[rng.randrange(len(groups))] for _ in groups]
        return statistics.fmean(statistics.fmean(g[rng.randrange(len(g))] for _ in g) for g in picked)

    ratios = sorted(draw(cand) / draw(ctrl) for _ in range(draws))
    return mean_of(cand) / mean_of(ctrl), ratios[int(0.025 * draws)], ratios[math.ceil(0.975 * draws) - 1]


def decide(ratio: float, lo: float, hi: float, min_gain: float) -> tuple[str, str]:
    gain, g_lo, g_hi = 1 - ratio, 1 - hi, 1 - lo
    span = f"saves {100 * gain:+.1f}% per iteration (95% interval {100 * g_lo:+.1f}% .. {100 * g_hi:+.1f}%)"
    if g_lo > min_gain:
        return "SWITCH", f"{span}: more than the {100 * min_gain:.1f}% required over the whole interval"
    if g_hi <= min_gain:
        return "KEEP", f"{span}: not more than the {100 * min_gain:.1f}% required anywhere in the interval"
    return "INCONCLUSIVE", f"{span}: the interval straddles the {100 * min_gain:.1f}% required (more repeats or iterations)"


def loss_match(ctrl: dict, cands: list[dict], rtol: float) -> dict:
    """Iteration-by-iteration relative difference of the candidate's lm loss to the control's."""
    ref = {i["iteration"]: i.get("lm_loss") for i in ctrl.get("iterations") or []}
    worst, at = 0.0, None
    for rec in cands:
        for it in rec.get("iterations") or []:
            a, b = ref.get(it["iteration"]), it.get("lm_loss")
            if a is None or b is None:
                continue
            d = abs(b - a) / max(abs(a), 1e-12)
            if d > worst:
                worst, at = d, it["iteration"]
    return {"rtol": rtol, "max_rel_diff": worst, "at_iteration": at, "match": worst <= rtol}


def memory_rows(ctrl: list[dict], cand: list[dict]) -> list[dict]:
    """Per rank, the largest figure over repeats of each arm, and candidate - control."""
    keys = ("max_reserved_bytes", "process_bytes", "device_used_bytes")

    def peaks(recs):
        out: dict[int, dict] = {}
        for rec in recs:
            for m in (rec.get("memory") or {}).get("ranks") or []:
                row = out.setdefault(m.get("rank"), {})
                for k in keys:
                    if isinstance(m.get(k), int):
                        row[k] = max(row.get(k, 0), m[k])
        return out
    a, b = peaks(ctrl), peaks(cand)
    rows = []
    for rank in sorted(set(a) | set(b), key=lambda r: (r is None, r)):
        row = {"rank": rank}
        for k in keys:
            ca, cb = a.get(rank, {}).get(k), b.get(rank, {}).get(k)
            row[f"control_{k}"], row[f"candidate_{k}"] = ca, cb
            row[f"delta_{k}"] = cb - ca if ca is not None and cb is not None else None
        rows.append(row)
    return rows


def judge(arms: list[dict], min_gain: float = 0.0, loss_rtol: float = 0.02) -> list[VerdictRecord]:
    """One verdict per candidate dispatcher among the arm records of one validation; VerdictInputError for
    an arm record of the wrong shape or with an impossible figure."""
    vet(arms)
    ctrl = [a for a in arms if a.get("dispatcher") == CONTROL]
    cands: dict[str, list[dict]] = {}
    for a in arms:
        if a.get("dispatcher") != CONTROL:
            cands.setdefault(a["dispatcher"], []).append(a)
    return [_one(ctrl, name, recs, min_gain, loss_rtol) for name, recs in cands.items()]


def _labels(recs: list[dict]) -> list[str]:
    out = []
    if any(r.get("functional") for r in recs):
        out.append("functional: CPU or shared-GPU ranks, the times are no measurement")
    if any(FORCED_BALANCE in (r.get("megatron_argv") or []) for r in recs):
        out.append("benchmark-only: forced-balance routing (--moe-router-force-load-balancing) is not how a model "
                   "trains; never a training-equivalent verdict")
    return out


def _one(ctrl: list[dict], name: str, cand: list[dict], min_gain: float, rtol: float) -> VerdictRecord:
    both = ctrl + cand
    v = VerdictRecord(validation=(both[0].get("validation") if both else ""), control=CONTROL, candidate=name,
                      verdict="FAIL", reason="", ratio=None, ci95=None, min_gain=min_gain,
                      repeats={"control": sum(a.get("status") == "PASS" for a in ctrl),
                               "candidate": sum(a.get("status") == "PASS" for a in cand)},
                      window=(cand[0].get("window") if cand else 0) or 0, loss={"rtol": rtol}, memory=[],
                      labels=_labels(both), notes=[], functional=any(a.get("functional") for a in both),
                      end_utc=utc_now())
    failed = [a for a in both if a.get("status") != "PASS"]
    if not ctrl:
        v.reason = "no control arm (alltoall) to compare with"
        return v
    if failed:
        v.reason = "; ".join(f"{a['dispatcher']} repeat {a.get('repeat')} FAILED: {'; '.join(a.get('errors') or [])}"
                             for a in failed)
        return v
    for a in cand:
        refuse, note = env_difference(ctrl[0].get("env"), a.get("env"))
        v.notes += [n for n in note if n not in v.notes]
        if refuse:
            v.verdict, v.reason = "REFUSED", f"the arms ran on different machines: {', '.join(refuse)}"
            return v
    v.loss = loss_match(ctrl[0], cand, rtol)
    v.memory = memory_rows(ctrl, cand)
    if not v.loss["match"]:
        v.reason = (f"the loss curve differs from the control's by {100 * v.loss['max_rel_diff']:.2f}% at iteration "
                    f"{v.loss['at_iteration']} (tolerance {100 * rtol:.1f}%): same seed and data must train alike")
        return v
    ratio, lo, hi = ratio_interval([samples(a) for a in ctrl], [samples(a) for a in cand])
    v.ratio, v.ci95 = ratio, [lo, hi]
    v.verdict, v.reason = decide(ratio, lo, hi, min_gain)
    if min(v.repeats.values()) < 2:
        v.notes.append("one repeat of an arm: the interval holds iteration noise only, not launch-to-launch noise")
    return v
