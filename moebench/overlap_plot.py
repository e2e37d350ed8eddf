"""`moebench.report --overlap-plot PNG`: exposed time and GEMM slowdown against the SM knob.

One line per (backend, phase) over its knob settings (a `--knob-sweep` of num_sms, or one point
per run); a backend without an SM knob is one point at x = 0 ("no SM knob"), and when no record
has an SM knob each (backend, phase) is one bar. Functional records
(CPU, shared-GPU ranks) are plotted only when nothing else is, and the title says so.
"""
from __future__ import annotations

from . import record
from .knobs import knobs_of


class PlotError(ValueError):
    pass


def _sms(r: dict) -> int:
    k = knobs_of(r)
    for key in ("num_sms", "num_sms_dispatch", "num_sms_combine"):
        if isinstance(k.get(key), int):
            return k[key]
    sms = ((r.get("backend") or {}).get("knobs") or {}).get("num_sms")
    return sms if isinstance(sms, int) else 0


def series(records: list[dict]) -> tuple[dict, bool]:
    """{(backend, phase): sorted [(sms, exposed_us, gemm_slowdown)]}, and whether they are functional."""
    recs = [r for r in records if r.get("overlap") and record.status(r) == "PASS"]
    real = [r for r in recs if not record.is_functional(r)]
    functional = not real
    out: dict = {}
    for r in real or recs:
        o = r["overlap"]
        out.setdefault((record.name(r), r["phase"]), {})[_sms(r)] = (o["exposed_us"], o["gemm_slowdown"])
    return {k: sorted((x, *v) for x, v in pts.items()) for k, pts in out.items()}, functional


def plot(records: list[dict], path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    lines, functional = series(records)
    if not lines:
        raise PlotError("no PASS records with overlap figures (run moebench.dispatch --overlap gemm)")
    fig = Figure(figsize=(11, 4.2))
    ax_e, ax_s = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    knobless = all(p[0] == 0 for pts in lines.values() for p in pts)   # no SM knob anywhere: one bar per line
    keys = sorted(lines)
    for i, key in enumerate(keys):
        pts, label = lines[key], " ".join(key)
        if knobless:
            ax_e.bar(i, pts[0][1], label=label)
            ax_s.bar(i, pts[0][2], label=label)
            continue
        xs = [p[0] for p in pts]
        ax_e.plot(xs, [p[1] for p in pts], marker="o", label=label)
        ax_s.plot(xs, [p[2] for p in pts], marker="o", label=label)
    xlabel = "backend and phase (no SM knob)" if knobless else "SMs given to communication (0: no SM knob)"
    for ax in (ax_e, ax_s):
        ax.set_xlabel(xlabel)
        if knobless:
            ax.set_xticks(range(len(keys)), [" ".join(k) for k in keys], rotation=15, fontsize=7)
    ax_e.set_ylabel("exposed us (overlapped - GEMM alone)")
    ax_s.set_ylabel("GEMM time overlapped / alone")
    ax_s.axhline(1.0, color="grey", lw=0.8)
    ax_e.legend(fontsize=7)
    w = next(r["workload"] for r in records if r.get("overlap"))
    gemm = next(r["overlap"]["gemm"] for r in records if r.get("overlap"))
    title = (f"T {w['num_tokens']} H {w['hidden']} E {w['num_experts']} K {w['topk']} EP {w['ep']}, GEMM {gemm}"
             + (" - FUNCTIONAL ONLY, not performance figures" if functional else ""))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(path)
