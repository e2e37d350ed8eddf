"""`report --as PEER`: moebench records in a peer's byte rule, timing boundary and column names, so that a row can be
set beside a table that peer published (README.md, "Published tables").

One Peer per harness: its rule (a `traffic.upstream` key, core/peer_rules.py and core/traffic.py), the moebench
figure that stands for its boundary and where the two differ (said under every table: e.g. an api time where the
peer timed kernels), and its columns under the peer's own names and number formats. A figure a record cannot give
(a view the backend has not, a rule the record predates, a scale-out figure on one node) is `-`, with its reason
once under the table: never a number from another rule or another boundary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import schema
from .tables import fit

PHASES = schema.PHASES


class Missing(Exception):
    """A cell the record cannot fill: its reason goes under the table."""


@dataclass(frozen=True)
class Column:
    head: str
    value: Callable                  # (the row's records: {phase: record}, this row's phase or None) -> number | str
    fmt: str = "{:.2f}"


@dataclass(frozen=True)
class Peer:
    name: str
    title: str
    rule: str                        # what a copy is and what it carries, where it is read from
    boundary: str                    # what the peer times
    stands_in: str                   # which moebench figure fills its columns, and where it differs
    round_trip: bool                 # one row per dispatch + combine pair, else one per phase
    columns: tuple[Column, ...]


# ---- what a record gives ------------------------------------------------------------------------------

def view_us(r: dict, view: str) -> float:
    """A record's figure in one timing view, or Missing with the record's own reason."""
    if view == "api":
        if schema.median_us(r) is None:
            raise Missing("not timed")
        return schema.median_us(r)
    raw = (r.get("views") or {}).get(view)
    if raw is None:
        raise Missing(f"no {view} view in the record (written before moebench timed it)")
    if "none" in raw or "fail" in raw:
        raise Missing(f"{view} view: {raw.get('none') or raw.get('fail')}")
    return schema.view_us(r, view)


def upstream(r: dict, key: str) -> float:
    """A peer rule's bytes (traffic.upstream), or Missing: on one node for a scale-out figure, else the record
    predates the rule."""
    up = schema.traffic(r).get("upstream") or {}
    if key in up:
        return up[key]
    w = r["workload"]
    if ("rdma" in key or "scaleout" in key) and w["ep"] <= w.get("gpus_per_node", 8):
        raise Missing(f"{key}: the ranks sit on one node, the rule has no cross-node figure")
    raise Missing(f"traffic.upstream.{key}: the record predates this rule (an older moebench wrote it); rerun")


def one_node(r: dict) -> bool:
    return r["workload"]["ep"] <= r["workload"].get("gpus_per_node", 8)


def gbps(nbytes: float, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def _phase(fn):
    """A per-phase cell: fn(record of the row's phase)."""
    return lambda recs, phase: fn(recs[phase])


def _both(fn):
    """A round-trip cell: fn(dispatch record, combine record)."""
    return lambda recs, phase: fn(recs["dispatch"], recs["combine"])


def _pair_us(d: dict, c: dict) -> float:
    return view_us(d, "api") + view_us(c, "api")


def _pair_bytes(d: dict, c: dict, key: str) -> float:
    return upstream(d, key) + upstream(c, key)


def _chained(r: dict, key: str = "median_over_ranks_us") -> float:
    view_us(r, "chained")                       # Missing with its reason where there is none
    return r["views"]["chained"][key]


def _deepep_view(r: dict) -> str:
    """test_intranode times the cached call (events); test_internode and test_low_latency time kernels (kineto)."""
    return "kernel" if (schema.name(r) == "deepep-ll" or not one_node(r)) else "cached"


def _nvl(r: dict, key: str) -> float:
    """DeepEP's / HybridEP's NVL bytes: the named rule, else moebench's algbw bytes (the same rule, checked equal
    in tests/core/test_peer_rules.py) in records written before the named key."""
    try:
        return upstream(r, key)
    except Missing:
        if schema.traffic(r).get("bytes") is None:
            raise
        return schema.traffic(r)["bytes"]


def _wire(d: dict, c: dict) -> str:
    """CollectiveX's logical_copies.wire: per-assignment for kernels that send one copy per (token, expert)."""
    b = d.get("backend") or {}
    return "assign" if (not b.get("dedup", True) or (b.get("knobs") or {}).get("mode") == "ll") else "dedup"


def _ep_bench_rdma(r: dict) -> float:
    """ep_bench prints rdma_bw = 0.00 on one node (no remote send)."""
    return 0.0 if one_node(r) else upstream(r, "ep_bench_ht_rdma_bytes")


# ---- the peers ------------------------------------------------------------------------------------------

PEERS = {p.name: p for p in (
    Peer("collectivex", "CollectiveX (SemiAnalysisAI/InferenceX experimental/CollectiveX)",
         "unique (token, destination rank) pairs, self included, payload only (+ fp32 scale per 128 on an fp8 "
         "dispatch), combine bf16 (collectivex_bytes); GB/s per GPU = the group's bytes / EP",
         "dispatch and combine: each drained, per-iteration MAX over ranks, p50 (layout and an fp8 quantize inside); "
         "pair_period: 128 free-running dispatch -> combine pairs, 16 dropped, per-pair MEDIAN over ranks, p50",
         "dispatch/combine: the api view (barrier, per-iteration max over ranks, median; the L2 flushed before each "
         "call, fp8 inputs arrive quantized); pair_period: the chained view's median_over_ranks_us (one chain, "
         "CollectiveX pools 4 trials)", True,
         (Column("wire", lambda recs, p: _wire(recs["dispatch"], recs["combine"]), "{}"),
          Column("dispatch p50 us", lambda recs, p: view_us(recs["dispatch"], "api"), "{:.1f}"),
          Column("combine p50 us", lambda recs, p: view_us(recs["combine"], "api"), "{:.1f}"),
          Column("pair_period p50 us", _both(lambda d, c: _chained(d)), "{:.1f}"),
          Column("dispatch GB/s/GPU", _both(lambda d, c: gbps(upstream(d, "collectivex_bytes"), view_us(d, "api"))),
                 "{:.1f}"),
          Column("combine GB/s/GPU", _both(lambda d, c: gbps(upstream(c, "collectivex_bytes"), view_us(c, "api"))),
                 "{:.1f}"))),
    Peer("aws", "AWS fair_ep_benchmark (awslabs/awsome-distributed-ai ep-backend-comparison, RESULTS.md)",
         "one copy per valid (token, expert) selection: dispatch tensor (+ fp8 scales) plus bf16 combine tensor, "
         "metadata excluded (aws_fair_bytes); scale-out: selections to another node", "one CUDA event pair around "
         "dispatch + combine behind one barrier, the slowest rank per iteration, median",
         "Latency: the api view's dispatch median + combine median, each behind its own barrier (not one event pair "
         "around both); AWS's table is the median of 3 process starts", True,
         (Column("EP size", lambda recs, p: f"{recs['dispatch']['workload']['ep']} ranks", "{}"),
          Column("Dispatch dtype", lambda recs, p: recs["dispatch"]["workload"]["dtype"].upper(), "{}"),
          Column("Latency", _both(lambda d, c: _pair_us(d, c) / 1e3), "{:.4f} ms"),
          Column("Input throughput", _both(lambda d, c: d["workload"]["num_tokens"] * d["workload"]["ep"]
                                           / (_pair_us(d, c) * 1e-6)), "{:,.2f} tokens/s"),
          Column("Logical throughput", _both(lambda d, c: gbps(_pair_bytes(d, c, "aws_fair_bytes"), _pair_us(d, c))),
                 "{:.2f} GB/s/rank"),
          Column("Scale-out logical throughput", _both(lambda d, c: gbps(_pair_bytes(d, c, "aws_fair_scaleout_bytes"),
                                                                         _pair_us(d, c))), "{:.2f} GB/s/rank"))),
    Peer("nccl-tests", "nccl-tests alltoall_perf (NVIDIA/nccl-tests src/alltoall.cu)",
         "size = the bytes one rank sends, its own chunk included (nccl_tests_alltoall_bytes: the (token, rank) rows "
         "of an alltoallv); algbw = size / time; busbw = algbw x (n - 1) / n", "host wall clock over all iterations "
         "after one stream sync, / iterations, averaged over ranks (-a 1)",
         "time: the api view (per-iteration max over ranks, median); busbw assumes 1/n local, moebench's own busbw "
         "counts the run's real remote pairs", False,
         (Column("size (B)", _phase(lambda r: upstream(r, "nccl_tests_alltoall_bytes")), "{:.0f}"),
          Column("time (us)", _phase(lambda r: view_us(r, "api"))),
          Column("algbw (GB/s)", _phase(lambda r: gbps(upstream(r, "nccl_tests_alltoall_bytes"), view_us(r, "api")))),
          Column("busbw (GB/s)", _phase(lambda r: gbps(upstream(r, "nccl_tests_alltoall_bus_bytes"),
                                                       view_us(r, "api")))),
          Column("#wrong", _phase(lambda r: 0 if schema.status(r) == "PASS" else "N/A"), "{}"))),
    Peer("deepep", "DeepEP V1 (deepseek-ai/DeepEP tests/legacy: test_intranode, test_internode, test_low_latency)",
         "NVL: received (token, rank) rows x 2H (x (1 + 4/128) / 2 fp8), combine bf16 (deepep_nvl_bytes); RDMA: "
         "(token, node) pairs incl. the sender's node (deepep_rdma_bytes); LL: per valid (token, k) slot, "
         "H + H/128 x 4 + 16 dispatch, 2H combine (deepep_ll_bytes)", "test_intranode: CUDA events around the "
         "cached-handle call, L2 flushed, mean of calls after the first, per rank, best of a chunk sweep; "
         "test_internode and test_low_latency: kineto kernel time",
         "t: the cached view (rank 0's mean) intranode, the kernel view across nodes and for deepep-ll; the run's "
         "own knobs, not a tuning sweep's best", False,
         (Column("t from", _phase(_deepep_view), "{}"),
          Column("t (us)", _phase(lambda r: view_us(r, _deepep_view(r)))),
          Column("GB/s (NVL)", _phase(lambda r: gbps(_nvl(r, "deepep_nvl_bytes"), view_us(r, _deepep_view(r))))),
          Column("GB/s (RDMA)", _phase(lambda r: gbps(upstream(r, "deepep_rdma_bytes"), view_us(r, _deepep_view(r))))),
          Column("GB/s (LL)", _phase(lambda r: gbps(upstream(r, "deepep_ll_bytes"), view_us(r, _deepep_view(r))))))),
    Peer("deepep-v2", "DeepEP V2 (deepseek-ai/DeepEP tests/elastic/test_ep.py, README)",
         "SU: received (token, rank) rows, local included, x (payload + top-k ids int64 + weights fp32); combine "
         "2H + weights (deepep_v2_bytes)", "kineto: dispatch_impl / combine_impl kernel time per call, a GPU "
         "sleep and a barrier before each, L2 flushed",
         "t: the kernel view (every communication kernel of the call; test_ep reports its copy epilogue apart)",
         False,
         (Column("t (us)", _phase(lambda r: view_us(r, "kernel")), "{:.3f}"),
          Column("GB/s (SU)", _phase(lambda r: gbps(upstream(r, "deepep_v2_bytes"), view_us(r, "kernel"))), "{:.0f}"),
          Column("GB/s (SO)", _phase(lambda r: _no_so()), "{:.0f}"),
          Column("bytes", _phase(lambda r: upstream(r, "deepep_v2_bytes")), "{:.0f}"))),
    Peer("ep_bench", "NCCL EP ep_bench (NVIDIA/nccl-extensions nccl_ep/ep_bench.cu)",
         "HT since 2026-07-21: unique (token, target rank) sends x bytes per token, rdma = sends to other nodes, nvl = "
         "total - rdma (ep_bench_ht_bytes); before: (token, node) sends (ep_bench_ht_send_before_0721_bytes); LL: "
         "ncclep_ll_bytes", "CUDA events per call (the first dropped), mean over iterations, then over ranks; and "
         "CUPTI kernel time",
         "total: the api view (per-iteration max over ranks, median, not the mean over ranks); kernel: the kernel "
         "view (rank 0's)", False,
         (Column("total (us)", _phase(lambda r: view_us(r, "api"))),
          Column("total_bw (GB/s)", _phase(lambda r: gbps(upstream(r, "ep_bench_ht_bytes"), view_us(r, "api")))),
          Column("nvl_bw", _phase(lambda r: gbps(upstream(r, "ep_bench_ht_bytes") - _ep_bench_rdma(r),
                                                 view_us(r, "api")))),
          Column("rdma_bw", _phase(lambda r: gbps(_ep_bench_rdma(r), view_us(r, "api")))),
          Column("send total_bw before 07-21",
                 _phase(lambda r: gbps(upstream(r, "ep_bench_ht_send_before_0721_bytes"), view_us(r, "api")))),
          Column("LL (GB/s)", _phase(lambda r: gbps(upstream(r, "ncclep_ll_bytes"), view_us(r, "api")))),
          Column("kernel (us)", _phase(lambda r: view_us(r, "kernel"))),
          Column("kernel total_bw", _phase(lambda r: gbps(upstream(r, "ep_bench_ht_bytes"), view_us(r, "kernel")))))),
    Peer("hybridep", "HybridEP (deepseek-ai/DeepEP branch hybrid-ep, tests/test_hybrid_ep.py, README_Hybrid-EP.md)",
         "NVL: dispatched_hidden.numel() x 2 (x (1 + 4/128) / 2 fp8), combine bf16 (hybridep_nvl_bytes); RDMA: "
         "(token, node) pairs, local node kept, fp8 factor on both phases (hybridep_rdma_bytes)",
         "Torch API: CUDA events around the handle-reusing call (bench); kernel: kineto",
         "Torch API: the cached view (rank 0's mean; HybridEP prints avg/min/max over ranks); kernel: the kernel "
         "view", False,
         (Column("Torch API (us)", _phase(lambda r: view_us(r, "cached"))),
          Column("GB/s (NVL)", _phase(lambda r: gbps(_nvl(r, "hybridep_nvl_bytes"), view_us(r, "cached")))),
          Column("GB/s (RDMA)", _phase(lambda r: gbps(upstream(r, "hybridep_rdma_bytes"), view_us(r, "cached")))),
          Column("kernel (us)", _phase(lambda r: view_us(r, "kernel"))),
          Column("kernel GB/s (NVL)", _phase(lambda r: gbps(_nvl(r, "hybridep_nvl_bytes"), view_us(r, "kernel")))))),
)}


def _no_so() -> float:
    raise Missing("DeepEP V2's scale-out count follows its logical domains (get_logical_domain_size), "
                  "which moebench does not record: not computed")


# ---- rows and the table -----------------------------------------------------------------------------

def _units(peer: Peer, records: list[dict]):
    """(the row's records by phase, its phase or None): every timed phase record, or every case with both phases
    timed (round-trip peers)."""
    timed = [r for r in records if r.get("phase") in PHASES and schema.timed(r)]
    if not peer.round_trip:
        yield from (({r["phase"]: r}, r["phase"]) for r in timed)
        return
    pairs: dict = {}
    for r in timed:
        key = (str(sorted(r["workload"].items())), schema.name(r), schema.knob_str(r), r.get("device"), schema.gpu(r))
        pairs.setdefault(key, {})[r["phase"]] = r
    yield from ((recs, None) for recs in pairs.values() if set(recs) == set(PHASES))


def rows(peer: Peer, records: list[dict]) -> list[dict]:
    """One dict per row: T, backend (+ knobs), phase, the peer's cells by column (None where missing) and the
    reasons of the missing ones."""
    out = []
    for recs, phase in _units(peer, records):
        cells, missing = {}, {}
        for col in peer.columns:
            try:
                cells[col.head] = col.value(recs, phase)
            except Missing as e:
                cells[col.head], missing[col.head] = None, str(e)
        r = recs[phase or "dispatch"]
        knobs = schema.knob_str(r)
        out.append({"peer": peer.name, "T": r["workload"]["num_tokens"], "workload": r["workload"],
                    "backend": schema.name(r) + (f" [{knobs}]" if knobs else ""),
                    "phase": phase or "dispatch + combine", "cells": cells, "missing": missing,
                    "functional": schema.is_functional(r)})
    return out


def _cell(col: Column, v) -> str:
    if v is None:
        return "-"
    return col.fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def format_as(peer: Peer, groups: dict[str, list[dict]], markdown: bool = False) -> str:
    """The records of each group (title -> records) as the peer's table, and under it: the peer's rule, its
    boundary, the moebench figure standing for it, and each reason for a `-` once."""
    from tabulate import tabulate
    c = "" if markdown else "# "
    parts, why, functional, shown = [f"{c}as {peer.title}"], {}, False, 0
    head = ["T", "backend"] + ([] if peer.round_trip else ["phase"]) + [col.head for col in peer.columns]
    for title, recs in groups.items():
        found = rows(peer, recs)
        if not found:
            continue
        shown += len(found)
        table = []
        for row in found:
            functional |= row["functional"]
            for col, reason in row["missing"].items():
                cols = why.setdefault(reason, [])
                if col not in cols:
                    cols.append(col)
            lead = [row["T"], row["backend"]] + ([] if peer.round_trip else [row["phase"]])
            table.append(lead + [_cell(col, row["cells"][col.head]) for col in peer.columns])
        parts += [("### " if markdown else "# ") + title,
                  tabulate(table, headers=head, tablefmt="github" if markdown else "simple", disable_numparse=True)]
    if not shown:
        parts.append(f"{c}no timed PASS records to show" + (" (a dispatch and a combine of one case)"
                                                           if peer.round_trip else ""))
    parts += [f"{c}rule: {peer.rule}", f"{c}{peer.name} times: {peer.boundary}", f"{c}here: {peer.stands_in}"]
    parts += [f"{c}- in {', '.join(cols)}: {reason}" for reason, cols in why.items()]
    if functional:
        parts.append(f"{c}rows on CPU/gloo or shared-GPU ranks are functional only: not figures to set beside a table")
    return "\n".join(parts if markdown else fit(parts))
