"""Plots of records, for `moebench.report`.

`plot_bandwidth` (--plot): GB/s against tokens per rank, one line per backend, with the nominal and
measured ceiling lines, one panel per shape family x phase.

`plot_overlap` (--overlap-plot): exposed time and GEMM slowdown against the SM knob.
One line per (backend, phase) over its knob settings (a `--knob-sweep` of num_sms, or one point
per run); a backend without an SM knob is one point at x = 0 ("no SM knob"), and when no record
has an SM knob each (backend, phase) is one bar. Functional records
(CPU, shared-GPU ranks) are plotted only when nothing else is, and the title says so.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..cli import OutputError
from ..core.workload import describe
from . import schema
from .schema import PHASES
from .tables import sig3

METRICS = ("busbw", "algbw", "wirebw", "nvlink", "net")



class PlotError(ValueError):
    pass


def plot_problem(path: str | None, flag: str) -> str:
    """'' when a plot can be written to PATH, checked before any work; else one line naming the flag: no
    matplotlib, or a suffix matplotlib writes no format for (pgf: it needs a TeX system). A PATH without a
    suffix is written as PNG under exactly that name (save)."""
    if path is None:
        return ""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return f"{flag} needs matplotlib: pip install 'moebench[plot]'"
    fmt = Path(path).suffix.lower().removeprefix(".")
    formats = sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"})
    if fmt and fmt not in formats:
        return f"{flag} {path}: matplotlib writes no .{fmt} file (it writes {', '.join(formats)}; no suffix: PNG)"
    return ""


def _sms(r: dict) -> int:
    k = schema.knobs_of(r)
    for key in ("num_sms", "num_sms_dispatch", "num_sms_combine"):
        if isinstance(k.get(key), int):
            return k[key]
    sms = schema.backend_knobs(r).get("num_sms")
    return sms if isinstance(sms, int) else 0


def overlap_series(records: list[dict]) -> tuple[dict, bool]:
    """{(backend, phase): sorted [(sms, exposed_us, gemm_slowdown)]}, and whether they are functional."""
    recs = [r for r in records if r.get("overlap") and schema.status(r) == "PASS"]
    real = [r for r in recs if not schema.is_functional(r)]
    functional = not real
    out: dict = {}
    for r in real or recs:
        o = r["overlap"]
        out.setdefault((schema.name(r), r["phase"]), {})[_sms(r)] = (o["exposed_us"], o["gemm_slowdown"])
    return {k: sorted((x, *v) for x, v in pts.items()) for k, pts in out.items()}, functional


def plot_overlap(records: list[dict], path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    lines, functional = overlap_series(records)
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
    FigureCanvasAgg(fig)
    save(fig, path, 110)


def _series(recs: list[dict], metric: str) -> dict[str, tuple[list, list]]:
    """backend label -> (tokens, best GB/s over knob settings and repeats)."""
    per: dict = {}
    settings: dict = {}
    for r in recs:
        v = schema.traffic(r).get(f"{metric}_GBps")
        if v is None:
            continue
        name = schema.name(r)
        settings.setdefault(name, set()).add(schema.knob_str(r))
        t = r["workload"]["num_tokens"]
        per.setdefault(name, {})[t] = max(v, per.get(name, {}).get(t, 0.0))
    out = {}
    for name, pts in sorted(per.items()):
        n = len(settings[name])
        label = name + (f" (best of {n} knob settings)" if n > 1 else "")
        out[label] = (sorted(pts), [pts[t] for t in sorted(pts)])
    return out


def _ceilings(recs: list[dict]) -> list[tuple[str, float, str]]:
    """(kind, GB/s, label) for the nominal and measured ceilings recorded with these rows."""
    out = []
    nominal = [(r["traffic"]["ceiling_GBps"], r["traffic"].get("ceiling_source") or "nominal")
               for r in recs if schema.traffic(r).get("ceiling_GBps")]
    if nominal:
        v, src = max(set(nominal), key=nominal.count)
        out.append(("nominal", v, f"nominal ceiling {sig3(v)} GB/s ({src})"))
    measured = [r["traffic"]["measured_ceiling_GBps"] for r in recs
                if schema.traffic(r).get("measured_ceiling_GBps")]
    if measured:
        v = float(np.median(measured))
        out.append(("measured", v, f"measured ceiling {sig3(v)} GB/s (all_to_all_single busbw)"))
    return out


def plot_bandwidth(records: list[dict], path: str | None = None, metric: str = "busbw"):
    """GB/s against tokens per rank, one line per backend and the ceiling lines, one panel per
    (shape family, phase); saved as PNG when `path` is given. Returns the matplotlib Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    if metric not in METRICS:
        raise PlotError(f"--metric must be one of {', '.join(METRICS)}")
    recs = [r for r in schema.latest(records) if schema.timed(r) and r["phase"] in PHASES]
    if not recs:
        raise PlotError("no PASS records with timing to plot")
    panels: dict = {}
    for r in recs:
        panels.setdefault((describe(r["workload"], tokens=False), r.get("device"), r["phase"]), []).append(r)
    keys = sorted(panels, key=lambda k: (k[0], k[1] or "", PHASES.index(k[2])))
    cols = 2 if len(keys) > 1 else 1
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(7 * cols, 4.5 * rows))
    FigureCanvasAgg(fig)
    for i, key in enumerate(keys):
        _panel(fig.add_subplot(rows, cols, i + 1), key, panels[key], metric)
    fig.tight_layout()
    if path:
        save(fig, path, 110)
    return fig


def save(fig, path: str, dpi: int) -> None:
    """A figure to exactly PATH, in the format its suffix names (PNG without one: matplotlib would write
    PATH.png instead), its folder made as --out makes its own; OutputError (one line, exit 1) when the
    write fails after the run."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi, format=Path(path).suffix.lower().removeprefix(".") or "png")
    except (OSError, ValueError, RuntimeError) as e:
        raise OutputError(f"{path}: the plot could not be written ({getattr(e, 'strerror', None) or e})") from None


def _panel(ax, key, recs: list[dict], metric: str) -> None:
    fam, device, phase = key
    m = metric
    note = ""
    if m == "busbw" and all(not (r["traffic"].get("bus_bytes") or 0) for r in recs):
        m, note = "algbw", " (EP 1: no remote pairs)"
    ticks = set()
    for label, (xs, ys) in _series(recs, m).items():
        ax.plot(xs, ys, marker="o", label=label)
        ticks.update(xs)
    for kind, v, label in _ceilings(recs):
        ax.axhline(v, linestyle="--" if kind == "nominal" else ":", color="k" if kind == "nominal" else "tab:red",
                   label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    ax.set_xlabel("tokens per rank")
    ax.set_ylabel(f"{m} GB/s{note}")
    gpu = next((schema.gpu(r) for r in recs if schema.gpu(r)), None)
    where = gpu or device
    ax.set_title(f"{phase}: {fam} [{where}]" + (" CPU: functional only" if device == "cpu" else ""), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def permute_device(timed) -> str:
    """The plot title's device: the GPU of the records, or a CPU run said plainly."""
    gpu = timed[0]["env"].get("gpu") if timed else None
    return gpu or "CPU (functional only, not performance figures)"


def plot_permute(recs, copy_GBps, path):
    """moebench.permute's effective GB/s per shape, op and impl against the copy of the same run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    timed = [r for r in recs if "timing" in r]
    groups = list(dict.fromkeys((f"{r['shape']['T']}x{r['shape']['H']}\n{r['op']}") for r in timed))
    impls = list(dict.fromkeys(r["impl"] for r in timed))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(groups)), 5))
    wid = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        vals = [next((r["GBps"] for r in timed if r["impl"] == impl
                      and f"{r['shape']['T']}x{r['shape']['H']}\n{r['op']}" == g), 0) for g in groups]
        ax.bar([j + i * wid for j in range(len(groups))], vals, wid, label=impl)
    ax.axhline(copy_GBps, color="k", ls="--", label=f"D2D copy {copy_GBps:.0f} GB/s")
    ax.axhline(0.9 * copy_GBps, color="gray", ls=":", label="0.9 x copy")
    ax.set_xticks([j + wid * (len(impls) - 1) / 2 for j in range(len(groups))], groups, fontsize=8)
    ax.set_ylabel("effective GB/s (unique bytes)")
    ax.set_title(f"moebench permute/unpermute, {permute_device(timed)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, 120)
    return fig


MATRIX_COLOURS = {"PASS": "#4caf50", "CLAMPED": "#cddc39", "WAIVED": "#bdbdbd", "REFUSED": "#ff9800", "FAIL": "#e53935"}


def plot_matrix(ms: list[dict], path: str):
    """The capability matrices (records/matrix.py) as heat maps, one panel per sweep: a colour per status, the
    status and its one-word reason in each cell, white where a cell never ran. Returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from .matrix import STATES
    order = ("-", *STATES)
    fig = Figure(figsize=(max(6.0, 1.3 * max(len(m["cases"]) for m in ms) + 2), sum(0.5 * len(m["backends"]) + 1.2
                                                                                   for m in ms)))
    FigureCanvasAgg(fig)
    for i, m in enumerate(ms):
        ax = fig.add_subplot(len(ms), 1, i + 1)
        cells = [[m["cells"].get((b, k)) for k, _ in m["cases"]] for b in m["backends"]]
        codes = [[order.index(c.status) if c else 0 for c in row] for row in cells]
        ax.imshow(codes, cmap=ListedColormap(["white", *(MATRIX_COLOURS[s] for s in STATES)]), vmin=0,
                  vmax=len(order) - 1, aspect="auto")
        for y, row in enumerate(cells):
            for x, c in enumerate(row):
                ax.text(x, y, f"{c.status}\n{c.reason}".strip() if c else "-", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(m["cases"])), [lb for _, lb in m["cases"]], rotation=20, fontsize=7)
        ax.set_yticks(range(len(m["backends"])), m["backends"], fontsize=8)
        ax.set_title(f"capability matrix: sweep {m['sweep']}" + (f" ({m['where']})" if m["where"] else ""), fontsize=9)
    fig.tight_layout()
    save(fig, path, 110)
    return fig
