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


TABLE_COLUMNS = ("backend", "phase", "api us", "p90 us", "cached us", "kernel us", "graph us", "api-graph us",
                 "algbw GB/s", "busbw GB/s", "wirebw GB/s", "frac ceil", "check")
OVERLAP_COLUMNS = ("exposed us", "GEMM alone us", "GEMM slowdown")


def view_us(r: dict, view: str) -> float | None:
    """A record's time in a timing view, else None: `cached` and `kernel` rank 0's (as the upstream tests
    print), `graph` the median of the per-iteration max over ranks (as the api view's, so api - graph is
    the host overhead), `api` the record's median."""
    if view == "api":
        return schema.median_us(r)
    v = (r.get("views") or {}).get(view) or {}
    return v.get("median_us") if view == "graph" else v.get("mean_us", v.get("us"))


def table_rows(records: list[dict]) -> list[list[str]]:
    with_overlap = any(r.get("overlap") for r in records)
    rows = []
    for r in records:
        t, tr = schema.timing(r), schema.traffic(r)
        err = schema.error(r)
        err = shorten(err, 90)      # the whole error is in the JSONL
        check = schema.status(r) + (f" ({err})" if err else "")
        if t and schema.is_functional(r):      # CPU/gloo or shared-GPU ranks: the times are no measurement
            check += " [functional only]"
        row = [schema.name(r), r["phase"], sig3(t.get("median_us")), sig3(t.get("p90_us")),
               sig3(view_us(r, "cached")), sig3(view_us(r, "kernel")), sig3(view_us(r, "graph")),
               sig3(t.get("api_minus_graph_us")),
               sig3(tr.get("algbw_GBps")), sig3(tr.get("busbw_GBps")), sig3(tr.get("wirebw_GBps")),
               sig3(tr.get("frac_of_ceiling")), check]
        if with_overlap:
            o = r.get("overlap") or {}
            row[-1:-1] = [sig3(o.get("exposed_us")), sig3(o.get("gemm_alone_us")), sig3(o.get("gemm_slowdown"))]
        rows.append(row)
    return rows


TABLE_LEGEND = ("# api/cached/kernel/graph us: the timing views (README, Timing views): the call a training step makes, "
                "the call with its handle reused, the communication kernels alone, the graph-safe call replayed from a "
                "CUDA graph; api-graph us: the host overhead a step pays without graphs; algbw: received (token, rank) "
                "pairs, local included, x bytes per token / api time; busbw: the same from other ranks only (what "
                "crossed links); wirebw: bytes the backend really moved; frac ceil: busbw / the nominal link ceiling; "
                "exposed us, GEMM alone us, GEMM slowdown: --overlap; '-': not timed (FAIL, WAIVED), a view the "
                "backend has not (the JSONL says why), no ceiling (CPU, shared GPU or an unknown GPU, without "
                "--ceiling-gbps) or no remote pairs (EP 1)")


def format_table(records: list[dict]) -> str:
    from tabulate import tabulate
    head = list(TABLE_COLUMNS)
    if any(r.get("overlap") for r in records):
        head[-1:-1] = OVERLAP_COLUMNS
    return tabulate(table_rows(records), headers=head, tablefmt="simple", disable_numparse=True) + "\n" + TABLE_LEGEND


def format_best(entries: list[dict], tablefmt: str = "simple") -> str:
    from tabulate import tabulate
    rows = [[e["backend"], describe(e["workload"]), " ".join(f"{k}={v}" for k, v in e["knobs"].items()),
             f"{e['dispatch_us']:.1f}", f"{e['combine_us']:.1f}", f"{e['total_us']:.1f}", e["settings"]]
            for e in entries]
    return tabulate(rows, headers=("backend", "shape", "best knobs", "dispatch us", "combine us",
                                   "total us", "settings"), tablefmt=tablefmt, disable_numparse=True)
