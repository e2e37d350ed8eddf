"""Tables and number formatting for the terminal: the dispatch table with its legend, the best-knobs
table, and the figure and text formatting every tool's tables use."""
from __future__ import annotations

from ..core.workload import describe
from . import schema


def sig3(v) -> str:
    """A figure for a table (GB/s, us, fractions): three significant digits whatever its size
    (0.00213, 2.13, 213, 2130); '-' for None, 'nan' for NaN, other values as str."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if v != v:
        return "nan"
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{float(f'{v:.3g}'):.0f}"
    return f"{v:#.3g}".rstrip(".") if "e" not in f"{v:#.3g}" else f"{v:.3g}"


def fit(lines: list[str], width: int = 160) -> list[str]:
    """Note lines ('# ...') longer than WIDTH wrapped at words onto '#   ' lines, so a tool's output fits a
    terminal; other lines as they are."""
    import textwrap
    out = []
    for line in lines:
        if len(line) <= width or not line.startswith("#"):
            out.append(line)
        else:
            out += textwrap.wrap(line, width, subsequent_indent="#   ", break_long_words=False, break_on_hyphens=False)
    return out


def shorten(text: str, width: int) -> str:
    """TEXT cut to at most WIDTH characters at a word boundary, ending in '...' when cut (a single
    word longer than half the width is cut inside); the records keep the whole text."""
    if len(text) <= width:
        return text
    cut = text[: width - 3]
    space = cut.rfind(" ")
    if space >= width // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:([") + "..."


DEFAULT_VIEWS = ("api", "graph")    # the view columns a table shows without --wide
LEGEND = ("# us: median, slowest rank; lib: library kernels; algbw/busbw: (token, rank) pairs x B / us, all/remote; "
          "frac ceil: busbw/link; setup: build+1st call; README.md")


def columns(views: tuple[str, ...], wide: bool, overlap: bool) -> list[str]:
    """The dispatch table's header: api and its library share first, then (wide) its tails, the other views, (wide)
    api - graph where graph is shown."""
    head = ["backend", "phase", "SMs", "api us", "lib us", *(["p90 us", "p99 us"] if wide else []),
            *(f"{v} us" for v in views if v != "api")]
    if "graph" in views and wide:               # api us - graph us, both shown: --wide (setup ms keeps 160 columns)
        head.append("api-graph us")
    head += ["algbw GB/s", "busbw GB/s", *(["wirebw GB/s"] if wide else []), "frac ceil", "mem GiB", "setup ms"]
    return head + (["exposed us", "GEMM alone us", "GEMM slowdown"] if overlap else []) + ["check"]


def table_rows(records: list[dict], views: tuple[str, ...] = DEFAULT_VIEWS, wide: bool = False) -> list[list[str]]:
    """One row per timed or failed record; the check cell says PASS / FAIL (why, shortened) and marks
    functional-only figures."""
    overlap = any(r.get("overlap") for r in records)
    rows = []
    for r in records:
        t, tr = schema.timing(r), schema.traffic(r)
        err = shorten(schema.error(r), 90) if wide else ""     # else a line below the table; all of it in the JSONL
        check = schema.status(r) + (f" ({err})" if err else "")
        if t and schema.is_functional(r):      # CPU/gloo or shared-GPU ranks: the times are no measurement
            check += " [functional]"
        row = [label(r), r["phase"], sig3(sms(r)), sig3(t.get("median_us")), sig3(t.get("library_us")),
               *([sig3(t.get("p90_us")), sig3(t.get("p99_us"))] if wide else []),
               *(sig3(schema.view_us(r, v)) for v in views if v != "api")]
        if "graph" in views and wide:
            row.append(sig3(t.get("api_minus_graph_us")))
        row += [sig3(tr.get("algbw_GBps")), sig3(tr.get("busbw_GBps")),
                *([sig3(tr.get("wirebw_GBps"))] if wide else []), sig3(tr.get("frac_of_ceiling")), gib(r),
                sig3(schema.setup_ms(r))]
        if overlap:
            o = r.get("overlap") or {}
            row += [sig3(o.get("exposed_us")), sig3(o.get("gemm_alone_us")), sig3(o.get("gemm_slowdown"))]
        rows.append(row + [check])
    return rows


def label(r: dict) -> str:
    """The backend's name, with its mode where it has several (ncclep ht / ll, hybridep's), and which repeat
    (--repeats N: `#2/3`)."""
    mode, rep = schema.backend_knobs(r).get("mode"), r.get("repeat") or {}
    return (schema.name(r) + (f" {mode}" if isinstance(mode, str) and mode else "")
            + (f" #{rep['index'] + 1}/{rep['of']}" if rep else ""))


def sms(r: dict):
    """The SMs a record's backend used (knobs num_sms_used), None where the record does not say (older ones)."""
    return schema.backend_knobs(r).get("num_sms_used")


def gib(r: dict) -> str:
    """The record's footprint in GiB for a table cell ('-' where not measured, e.g. CPU runs)."""
    b = schema.footprint_bytes(r)
    return sig3(b / 2**30) if b is not None else "-"


def failures(records: list[dict]) -> list[str]:
    """One line per backend that FAILed, with why (the table's check cell says FAIL)."""
    seen = {}
    for r in records:
        if schema.status(r) == "FAIL" and r.get("phase") != "soak":
            seen.setdefault(schema.name(r), schema.error(r) or "FAIL")
    return [f"# FAIL {name}: {shorten(why, 140)}" for name, why in seen.items()]


def unavailable(records: list[dict]) -> list[str]:
    """One line per reason a backend did not run (WAIVED), naming the backends it holds for."""
    by_why: dict[str, list[str]] = {}
    for r in records:
        if schema.status(r) == "WAIVED":
            names = by_why.setdefault(schema.error(r), [])
            if schema.name(r) not in names:
                names.append(schema.name(r))
    return [f"# WAIVED {', '.join(names)}: {shorten(why, 150 - len(', '.join(names)))}" for why, names in by_why.items()]


def soak_lines(records: list[dict]) -> list[str]:
    """One line per soak (--soak): its counts, PASS or FAIL with why."""
    out = []
    for r in records:
        s = r.get("soak")
        if s:
            g = s.get("graph") or {}
            graph = f"; graph replays: {g['corrupted']} of {g['replays']} wrong" if "replays" in g else ""
            if (rb := s.get("rebuilt")) and rb.get("count"):
                graph += f"; rebuilt {rb['count']} times, {sig3(rb['median_ms'])} ms median"
            err = f": {shorten(schema.error(r), 100)}" if schema.error(r) else ""
            out.append(f"# soak {label(r)}: {schema.status(r)} {s['summary']}{graph}{err}")
    return out


def format_table(records: list[dict], views: tuple[str, ...] = DEFAULT_VIEWS, wide: bool = False) -> str:
    """The dispatch table: timed and failed rows (api and the `views` columns), each WAIVED backend on one
    line with its reason, a line per soak, one legend line. wide: every figure (wirebw, long errors)."""
    from tabulate import tabulate
    shown = [r for r in records if schema.status(r) != "WAIVED" and r.get("phase") != "soak"]
    overlap = any(r.get("overlap") for r in shown)
    out = []
    if shown:
        out.append(tabulate(table_rows(shown, views, wide), headers=columns(views, wide, overlap), tablefmt="simple",
                            disable_numparse=True))
    return "\n".join(out + ([] if wide else failures(records)) + unavailable(records) + soak_lines(records) + [LEGEND])


def format_best(entries: list[dict], tablefmt: str = "simple") -> str:
    from tabulate import tabulate
    rows = [[e["backend"], describe(e["workload"]), " ".join(f"{k}={v}" for k, v in e["knobs"].items()),
             f"{e['dispatch_us']:.1f}", f"{e['combine_us']:.1f}", f"{e['total_us']:.1f}", e["settings"]]
            for e in entries]
    return tabulate(rows, headers=("backend", "shape", "best knobs", "dispatch us", "combine us",
                                   "total us", "settings"), tablefmt=tablefmt, disable_numparse=True)


def format_permute(recs) -> str:
    """moebench.permute's table: one row per shape, op and impl, the anchors' speedups where they ran."""
    te = any("speedup_vs_te" in r for r in recs)
    head = ["shape TxHxKxE", "op", "impl", "us", "GB/s", "frac", "x mcore", *(["x te"] if te else []), "check"]
    rows = []
    for r in recs:
        s = r["shape"]
        t = r.get("timing", {})
        rows.append([f"{s['T']}x{s['H']}x{s['K']}x{s['E']}", r["op"], r["impl"],
                     sig3(t['median_us']) if t else "-", sig3(r['GBps']) if t else "-",
                     sig3(r['frac_of_copy']) if t else "-",
                     f"{r['speedup_vs_megatron']:.2f}" if "speedup_vs_megatron" in r else "-",
                     *([f"{r['speedup_vs_te']:.2f}" if "speedup_vs_te" in r else "-"] if te else []),
                     r["check"]["status"] + (f" ({r['check']['error'][:60]})" if r["check"]["error"] else "")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join(["# " + line(head)] + [line(r) for r in rows])
