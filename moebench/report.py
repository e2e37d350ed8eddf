"""python -m moebench.report FILE...: tables, plots and A/B verdicts from moebench JSONL records.

  FILE...                       tables grouped by shape family (H, E, K, EP, dtype, routing) and T;
                                a case run several times shows its last run, marked so
  --plot PNG                    GB/s against tokens per rank, one line per backend, with the
                                nominal and measured ceiling lines (one panel per shape x phase)
  --compare A B                 matched A/B per row: A and B are two JSONL files (two containers,
                                two commits) or two backend names within FILE...; B is judged
                                against A: faster, slower, or within noise, each side pooling every
                                run of a case; functional-only (CPU, shared-GPU) records are left out
  --markdown / --json           for pasting into a review / for machines
  --best-knobs                  the fastest knob setting per (backend, shape), from knob sweeps
  --matrix FILE                 the capability matrix of a sweep's records: backend x case cells, PASS /
                                CLAMPED / WAIVED / REFUSED (by the preflight) / FAIL with a one-word
                                reason (--plot PNG: a heat map)
  --as PEER                     the records in a peer's byte rule, timing boundary and column names
                                (collectivex, aws, nccl-tests, deepep, deepep-v2, ep_bench, hybridep), with
                                where this run's boundary is not the peer's, so a row can be set beside a
                                table that peer published

Noise band: where both sides hold repeats (dispatch --repeats N: fresh processes, the backend order rotated),
the 95% bootstrap interval over the repeats' medians, paired by repeat (records/repeats.py: B/A is the geometric
mean of each repeat's B/A; a pair run on different inputs is refused); else the 95% bootstrap interval of the
ratio of medians B/A, resampling the per-iteration times (`timing.samples_us`) of each side. Records without
samples fall back to a normal approximation from the p10/p90 spread. The output says which. A difference counts
only when the interval excludes 1 and the change is at least --min-effect. The iterations of one process do not
see run-to-run noise (clocks, placement): that is what repeats are for.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from . import cli
from .core.workload import describe
from .records import knobs, peers, repeats, schema
from .records.matrix import as_json, format_matrix, matrices
from .records.plots import METRICS, PlotError, plot_bandwidth, plot_matrix, plot_overlap, plot_problem
from .harness.views import SAMPLED as SAMPLED_VIEWS
from .records.reader import read_dispatch
from .records.schema import PHASES
from .records.tables import fit, format_best, gib, shorten, sig3

Z95 = 1.959964


class ReportError(ValueError):
    """Bad input: one line on stderr, exit 2."""


REPEATS_NOTE = "rows marked [last of N runs] show the case's last run; --compare pools every run of a case"


TABLE_HEAD = ("T", "backend", "knobs", "phase", "median us", "p10-p90 us", "algbw GB/s", "busbw GB/s",
              "frac ceil", "frac meas", "mem GiB", "setup ms", "check")


def _row(r: dict) -> list[str]:
    t, tr = schema.timing(r), schema.traffic(r)
    spread = f"{sig3(t.get('p10_us'))}-{sig3(t.get('p90_us'))}" if t.get("p10_us") is not None else "-"
    check = schema.status(r) + (f" ({shorten(schema.error(r), 40)})" if schema.error(r) else "")
    check += f" [last of {r['_runs']} runs]" if r.get("_runs", 1) > 1 else ""
    return [str(r["workload"]["num_tokens"]), schema.name(r), schema.knob_str(r) or "-", r["phase"],
            sig3(t.get("median_us")), spread, sig3(tr.get("algbw_GBps")), sig3(tr.get("busbw_GBps")),
            sig3(tr.get("frac_of_ceiling")), sig3(tr.get("frac_of_measured")), gib(r), sig3(schema.setup_ms(r)), check]


def _groups(records: list[dict]) -> dict[str, list[dict]]:
    phase_order = {p: i for i, p in enumerate(PHASES)}
    out: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (describe(r["workload"], tokens=False), r["workload"]["num_tokens"],
                                            schema.name(r), schema.knob_str(r),
                                            phase_order.get(r["phase"], 9), r["phase"])):
        env, shared = r.get("env") or {}, r.get("shared_gpu") or {}
        where = f"{r.get('device')}" + (f", {env['gpu']}" if env.get("gpu") else "") + (
            f", {shared['ranks_per_gpu']} ranks per GPU: functional only" if shared else "")
        out.setdefault(f"{describe(r['workload'], tokens=False)} ({where})", []).append(r)
    return out


def tables(records: list[dict], markdown: bool = False) -> str:
    """Tables grouped by shape family and device, rows sorted by T, backend, knobs, phase."""
    from tabulate import tabulate
    parts = []
    for title, recs in _groups(schema.latest(records)).items():
        parts.append(("### " if markdown else "# ") + title)
        parts.append(tabulate([_row(r) for r in recs], headers=TABLE_HEAD,
                              tablefmt="github" if markdown else "simple", disable_numparse=True))
        if any(r.get("_runs", 1) > 1 for r in recs):
            parts.append(("" if markdown else "# ") + REPEATS_NOTE)
        if any(schema.is_functional(r) for r in recs):
            parts.append(("" if markdown else "# ") + "rows on CPU/gloo or shared-GPU ranks: functional only, "
                         "not performance figures")
        parts.append("")
    return "\n".join(parts)


# ---- A/B compare ---------------------------------------------------------------------------------

def side(recs: list[dict], view: str = "api") -> dict:
    """Median and noise data of one side of a comparison (records of one key, pooled), in one timing view."""
    ts = [schema.view_timing(r, view) for r in recs]
    samples = [s for t in ts for s in (t.get("samples_us") or [])]
    if samples and all(t.get("samples_us") for t in ts):
        return {"median": float(np.median(samples)), "samples": np.asarray(samples, float), "source": "samples"}
    t = ts[-1]
    n = max(2, int(t.get("iters") or 2))
    sd = max(0.0, (t.get("p90_us", t["median_us"]) - t.get("p10_us", t["median_us"]))) / 2.563
    return {"median": t["median_us"], "se": 1.2533 * sd / math.sqrt(n), "source": "p10/p90"}


def ratio_interval(a: dict, b: dict, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float, str]:
    """(B/A ratio of medians, 95% low, high, method)."""
    ratio = b["median"] / a["median"]
    if "samples" in a and "samples" in b:
        rng = np.random.default_rng(seed)
        ma = np.median(rng.choice(a["samples"], (n_boot, a["samples"].size)), axis=1)
        mb = np.median(rng.choice(b["samples"], (n_boot, b["samples"].size)), axis=1)
        lo, hi = np.quantile(mb / ma, [0.025, 0.975])
        return ratio, float(lo), float(hi), "bootstrap"
    sa = a.get("se", 0.0) / a["median"] if "se" in a else _se_rel(a)
    sb = b.get("se", 0.0) / b["median"] if "se" in b else _se_rel(b)
    half = Z95 * math.hypot(sa, sb)
    return ratio, ratio * math.exp(-half), ratio * math.exp(half), "p10/p90 approx"


def _se_rel(s: dict) -> float:
    x = s["samples"]
    q10, q90 = np.quantile(x, [0.1, 0.9])
    return 1.2533 * (q90 - q10) / 2.563 / math.sqrt(x.size) / s["median"]


def verdict(ratio: float, lo: float, hi: float, min_effect: float = 0.01) -> str:
    """B against A: B takes `ratio` of A's time; faster/slower only when the interval excludes 1."""
    if hi < 1.0 and 1.0 - ratio >= min_effect:
        return "faster"
    if lo > 1.0 and ratio - 1.0 >= min_effect:
        return "slower"
    return "within noise"


def _best_by_key(records: list[dict], key, view: str = "api") -> dict:
    """key(record) -> records of the knob setting with the lowest median (in `view`) at that key."""
    groups: dict = {}
    for r in records:
        if schema.timed(r) and r["phase"] in PHASES and schema.view_timing(r, view):
            groups.setdefault(key(r), {}).setdefault(schema.knob_str(r), []).append(r)
    med = lambda rs: float(np.median([schema.view_timing(r, view)["median_us"] for r in rs]))  # noqa: E731
    return {k: min(v.values(), key=med) for k, v in groups.items()}


def compare(recs_a: list[dict], recs_b: list[dict], min_effect: float = 0.01, by_backend: bool = False,
            view: str = "api") -> dict:
    """Matched A/B rows in one timing view. by_backend: A and B are two backends' records, matched on workload
    and phase; else two runs, matched on workload, backend and phase. Returns {view, rows, only_a, only_b}."""
    def key(r):
        k = (json.dumps(r["workload"], sort_keys=True), r["phase"])
        return k if by_backend else k + (schema.name(r),)
    a, b = _best_by_key(recs_a, key, view), _best_by_key(recs_b, key, view)
    rows = []
    for k in sorted(set(a) & set(b), key=lambda k: (describe(json.loads(k[0]), tokens=False), json.loads(k[0])["num_tokens"],
                                                   k[2:], PHASES.index(k[1]))):
        sa, sb = side(a[k], view), side(b[k], view)
        paired = repeats.pairs(repeats.medians(a[k], view, not by_backend), repeats.medians(b[k], view, not by_backend))
        if paired:          # repeats in fresh processes: their medians are the samples, paired by repeat
            (ratio, lo, hi), method = repeats.interval(paired), repeats.method(len(paired))
            sa["median"], sb["median"] = (float(np.median([p[i] for p in paired])) for i in (0, 1))
        else:
            ratio, lo, hi, method = ratio_interval(sa, sb)
        w = json.loads(k[0])
        rows.append({"family": describe(w, tokens=False), "num_tokens": w["num_tokens"], "phase": k[1],
                     "backend_a": schema.name(a[k][0]), "backend_b": schema.name(b[k][0]),
                     "knobs_a": schema.knob_str(a[k][0]), "knobs_b": schema.knob_str(b[k][0]),
                     "a_median_us": sa["median"], "b_median_us": sb["median"], "ratio": ratio,
                     "a_footprint_bytes": schema.largest_footprint(a[k]),
                     "b_footprint_bytes": schema.largest_footprint(b[k]),
                     "ci_low": lo, "ci_high": hi, "noise": method,
                     "verdict": verdict(ratio, lo, hi, min_effect)})
    return {"view": view, "rows": rows, "only_a": len(set(a) - set(b)), "only_b": len(set(b) - set(a))}


def _mem_cell(a: int | None, b: int | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a / 2**30:.2f}->{b / 2**30:.2f} ({(b - a) / 2**30:+.2f})"


def format_compare(res: dict, label_a: str, label_b: str, markdown: bool = False) -> str:
    from tabulate import tabulate
    head = ("T", "backend", "phase", "A us", "B us", "B/A", "95% interval", "verdict", "mem GiB A->B")
    out = [f"{'' if markdown else '# '}A: {label_a}; B: {label_b}"]
    for fam in dict.fromkeys(r["family"] for r in res["rows"]):
        rows = []
        for r in (r for r in res["rows"] if r["family"] == fam):
            be = r["backend_a"] if r["backend_a"] == r["backend_b"] else f"{r['backend_a']} vs {r['backend_b']}"
            knobs = {r["knobs_a"], r["knobs_b"]} - {""}
            rows.append([r["num_tokens"], be + (f" [{' / '.join(sorted(knobs))}]" if knobs else ""), r["phase"],
                         sig3(r["a_median_us"]), sig3(r["b_median_us"]), f"{r['ratio']:.3f}",
                         f"{r['ci_low']:.3f}-{r['ci_high']:.3f}", r["verdict"],
                         _mem_cell(r.get("a_footprint_bytes"), r.get("b_footprint_bytes"))])
        out += [("### " if markdown else "# ") + fam,
                tabulate(rows, headers=head, tablefmt="github" if markdown else "simple", disable_numparse=True)]
    counts = {v: sum(r["verdict"] == v for r in res["rows"]) for v in ("faster", "slower", "within noise")}
    out.append(f"{'' if markdown else '# '}B ({label_b}) against A ({label_a}), {res.get('view', 'api')} view: "
               + ", ".join(f"{n} {v}" for v, n in counts.items())
               + f"; unmatched rows: {res['only_a']} only in A, {res['only_b']} only in B")
    out += [("" if markdown else "# ") + line for line in noise_lines(res["rows"])]
    if res.get("left_out_functional"):
        out.append(f"{'' if markdown else '# '}left out {res['left_out_functional']} record(s) that are "
                   f"{schema.FUNCTIONAL_NOTE}: no verdict above is on them")
    approx = sorted({f"{r['num_tokens']} {r['backend_a']} {r['phase']}" for r in res["rows"]
                     if r["noise"] == "p10/p90 approx"})
    if approx:
        out.append(f"{'' if markdown else '# '}NOTE: rows without timing.samples_us ({', '.join(approx[:4])}"
                   f"{', ...' if len(approx) > 4 else ''}): their noise band is a normal approximation from the "
                   "p10/p90 spread, not a bootstrap")
    return "\n".join(out if markdown else fit(out))


def noise_lines(rows: list[dict]) -> list[str]:
    """Which noise each verdict used: over repeats (paired) or over the iterations of pooled runs."""
    paired = [r for r in rows if r["noise"].startswith("paired")]
    out = []
    if paired:
        out.append(f"{len(paired)} row(s) judged over repeats ({paired[0]['noise']}): each repeat's median in fresh "
                   "processes, the backend order rotated, paired by repeat, B/A their geometric mean (AWS's fair EP "
                   "comparison)")
    if len(paired) < len(rows):
        out.append(f"{len(rows) - len(paired)} row(s) judged over iterations: each side pools every run of a case (all "
                   "their per-iteration samples); iterations of one process are not independent samples: "
                   "dispatch --repeats N gives repeats")
    return out


# ---- CLI -----------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m moebench.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", metavar="FILE", help="moebench JSONL files")
    p.add_argument("--plot", metavar="PNG", help="write GB/s against tokens per backend to PNG")
    p.add_argument("--overlap-plot", metavar="PNG",
                   help="write exposed time and GEMM slowdown against the SM knob to PNG (--overlap records)")
    p.add_argument("--metric", default="busbw", choices=METRICS, help="figure to plot (default busbw)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two JSONL files, or two backends in FILE...")
    p.add_argument("--view", choices=SAMPLED_VIEWS, default="api",
                   help="timing view the --compare verdicts use (default api; the verdict line names it)")
    p.add_argument("--min-effect", type=cli.number(0, high=1), default=0.01,
                   help="smallest relative change called faster/slower (default 0.01)")
    p.add_argument("--markdown", action="store_true", help="GitHub markdown tables")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--best-knobs", action="store_true", help="best knob setting per backend and shape")
    p.add_argument("--matrix", metavar="FILE", help="the capability matrix of the sweeps in FILE: backend x case, "
                   "PASS / CLAMPED / WAIVED / REFUSED / FAIL with a one-word reason (--markdown, --json; --plot PNG: "
                   "a heat map)")
    p.add_argument("--as", dest="as_peer", choices=tuple(peers.PEERS), metavar="PEER",
                   help=f"the records in a peer's byte rule, boundary and column names: {', '.join(peers.PEERS)}")
    return p


def _is_path(name: str) -> bool:
    """--compare's A or B names a file (present or not) rather than a backend."""
    return os.path.lexists(name) or os.sep in name or bool(Path(name).suffix)


def _compare_inputs(args) -> tuple[list[dict], list[dict], str, str, bool]:
    """Two files (each read on its own), or two backends of FILE...: a figure no verdict can take refuses."""
    a, b = args.compare
    if a == b:
        raise ReportError(f"--compare {a} {b}: the same {'file' if _is_path(a) else 'backend'} on both sides")
    if _is_path(a) or _is_path(b):
        if twice := cli.repeated_input((a, b)):
            raise ReportError(f"--compare: {twice}")
        ra, rb = (read_dispatch([f], "moebench.report", verdict=True) for f in (a, b))
        return ra, rb, a, b, False
    if not args.files:
        raise ReportError(f"--compare {a} {b}: neither names a file, so give FILE... holding backends {a} and {b}")
    recs = read_dispatch(args.files, "moebench.report", verdict=True)
    names = {schema.name(r) for r in recs}
    for n in (a, b):
        if n not in names:
            raise ReportError(f"--compare: {n!r} is neither a file nor a backend in the records "
                              f"(backends: {', '.join(sorted(names))})")
    return ([r for r in recs if schema.name(r) == a], [r for r in recs if schema.name(r) == b],
            a, b, True)


def run(args) -> int:
    bad_out = (cli.first_output_problem([(args.plot, "--plot"), (args.overlap_plot, "--overlap-plot")])
               or plot_problem(args.plot, "--plot") or plot_problem(args.overlap_plot, "--overlap-plot"))
    if bad := bad_out or cli.repeated_input(args.files):
        raise ReportError(bad)
    if args.as_peer and (args.compare or args.best_knobs):
        raise ReportError(f"--as {args.as_peer} sets records beside a peer's table: not with "
                          f"{'--compare' if args.compare else '--best-knobs'}")
    if args.matrix:
        return matrix(args)
    if args.compare:
        ra, rb, la, lb, by_backend = _compare_inputs(args)
        read = len(ra) + len(rb)
        ra, rb = schema.performance_only(ra, "report --compare"), schema.performance_only(rb, "report --compare")
        if not ra or not rb:
            raise ReportError(f"--compare: {la if not ra else lb} has no records left: all are {schema.FUNCTIONAL_NOTE}")
        res = compare(ra, rb, args.min_effect, by_backend, args.view)
        res["left_out_functional"] = read - len(ra) - len(rb)
        if not res["rows"]:
            raise ReportError(f"--compare: no matching PASS rows between {la} and {lb} in the {args.view} view")
        print(json.dumps(res, indent=1) if args.json else format_compare(res, la, lb, args.markdown))
        return 0
    if not args.files:
        raise ReportError("give one or more JSONL files")
    recs = read_dispatch(args.files, "moebench.report")
    if args.as_peer:
        peer = peers.PEERS[args.as_peer]
        print(json.dumps(peers.rows(peer, schema.latest(recs)), indent=1) if args.json else
              peers.format_as(peer, _groups(schema.latest(recs)), args.markdown))
    elif args.best_knobs:
        best = knobs.best_knobs(recs)
        print(json.dumps(best, indent=1) if args.json else
              format_best(best, "github" if args.markdown else "simple") if best else "# no knob settings")
    elif args.json:
        print(json.dumps([{k: v for k, v in r.items() if k not in ("_file", "_line", "_runs")}
                          for r in schema.latest(recs)], indent=1))
    else:
        print(tables(recs, args.markdown))
    if args.plot:
        try:
            plot_bandwidth(recs, args.plot, args.metric)
        except PlotError as e:
            raise ReportError(str(e)) from None
        print(f"{'' if args.markdown else '# '}plot: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    if args.overlap_plot:
        try:
            plot_overlap(recs, args.overlap_plot)
        except PlotError as e:
            raise ReportError(str(e)) from None
        print(f"{'' if args.markdown else '# '}overlap plot: {args.overlap_plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def matrix(args) -> int:
    """--matrix FILE: each sweep's capability matrix (records/matrix.py), and its heat map with --plot."""
    other = next((f for f, on in (("FILE...", args.files), ("--compare", args.compare), ("--as", args.as_peer),
                                  ("--best-knobs", args.best_knobs), ("--overlap-plot", args.overlap_plot)) if on), None)
    if other:
        raise ReportError(f"--matrix reads its one FILE: not with {other}")
    recs = read_dispatch([args.matrix], "moebench.report")
    ms = matrices(recs)
    if not ms:
        raise ReportError(f"--matrix {args.matrix}: no sweep records (it holds {len(recs)} record(s) of single runs; a "
                          "sweep's records name their cases: dispatch --sweep NAME --out FILE)")
    print(json.dumps(as_json(ms), indent=1) if args.json else format_matrix(ms, args.markdown))
    if args.plot:
        plot_matrix(ms, args.plot)
        print(f"{'' if args.markdown else '# '}matrix plot: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


@cli.tool
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except (ReportError, OSError, ValueError) as e:
        cli.error("moebench.report", e)
        return 2


if __name__ == "__main__":
    sys.exit(cli.run(main, "moebench.report"))
