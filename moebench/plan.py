"""python -m moebench.plan: what an EP layout would cost before the cluster is booked.

Megatron lays out expert parallelism with ranks ordered tp-ep-dp-pp and the expert tensor-parallel
size ETP (default: TP) innermost, so one EP group is the ranks base + i*ETP, i < EP: a block of
ETP*EP consecutive ranks. With G GPUs per node (one NVLink domain), EP rank i sits on node
i // (G / ETP); a group leaves the domain when ETP*EP > G.

The per-rank counts come from the routing generators (moebench.core.workload) and the byte rule
(moebench.core.traffic.traffic_of with that gpus_per_node), not from a formula: every EP rank's routing
is generated and its (token, destination rank) pairs are counted, split into local, NVLink (same
node) and network (other node). Dispatch receives the column sums of the pair matrix; combine sends
the same pairs back (bf16), so a rank receives its own tokens' pairs: the row sums. Large EP runs
on a sample of tokens per rank and scales the counts (the split is a per-token property).

Predicted time of a phase = max over ranks of max(NVLink bytes / NVLink GB/s, network bytes /
network GB/s): both link kinds run at once, the slowest rank sets the pace. Link speeds are the
nominal ceilings (moebench.core.ceilings) or the effective busbw of measured results (--results).

Memory per GPU is each backend's footprint, measured (--results of this shape) or estimated, against the GPU's
(--gpu-memory-gib, else the SKU's nominal size, core/ceilings.py): a shape no backend fits gets that as its only advice. Sizes past what
a cluster plan can have are refused (LIMITS), and EP x experts is bounded (MAX_EP_EXPERTS): every EP rank's
routing is drawn over every expert, so a plan takes seconds and bounded memory whatever the flags say.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from . import cli
from .core import ceilings, traffic
from .core.workload import DTYPES, Workload, WorkloadError, make_routing
from .harness.spec import add_shape_args
from .records import reader, schema

PLAN_NEEDS = ("num_tokens", "hidden", "topk", "dtype")   # the workload keys measured_links reads
SAMPLE_BUDGET = 1 << 25        # routing scores generated at most (EP ranks x tokens x experts)
MIN_SAMPLE = 64                # tokens drawn per rank at least (the slowest rank's count is a max over ranks)
MAX_EP_EXPERTS = 1 << 20       # EP x experts (EP 1024, 1024 experts): every rank draws MIN_SAMPLE+ tokens x experts
MAX_GPUS = 1 << 20             # GPUs in one plan, --gpus or ETP*EP*PP: past the largest clusters built
GBPS_RANGE = (0.01, 1e5)       # what a real link carries, GB/s per GPU per direction
# flag: (highest value, why): what a real plan can have; past it plan refuses (one line, exit 2), never advises
_GROUP = "no cluster plan has a larger parallel group"
LIMITS = {"ep": (1 << 16, _GROUP), "tp": (1 << 16, _GROUP), "etp": (1 << 16, _GROUP), "pp": (1 << 16, _GROUP),
          "gpus_per_node": (1 << 16, "no NVLink domain has more GPUs"), "hidden": (1 << 16, "no model is wider"),
          "num_experts": (1 << 16, "no MoE layer has more experts"),
          "topk": (1 << 8, "no router picks more experts per token"),
          "num_tokens": (1 << 24, "no step has more tokens per rank"),
          "sample_budget": (SAMPLE_BUDGET, "the default; lower samples fewer tokens")}


def layout(gpus: int, gpn: int, ep: int, tp: int = 1, etp: int | None = None, pp: int = 1) -> dict:
    """Megatron's rank layout for the expert-parallel group; WorkloadError when it does not fit."""
    etp = tp if etp is None else etp
    for name, v in (("ep", ep), ("tp", tp), ("etp", etp), ("pp", pp), ("gpus-per-node", gpn), ("gpus", gpus)):
        if v < 1:
            raise WorkloadError(f"--{name} must be >= 1, got {v}")
    if gpus > MAX_GPUS:
        raise WorkloadError(f"{gpus} GPUs (--gpus, else ETP*EP*PP) is more than any cluster has: at most {MAX_GPUS}")
    if gpus % (etp * ep * pp) or gpus % (tp * pp):
        raise WorkloadError(f"--gpus {gpus} is not divisible by ETP*EP*PP = {etp * ep * pp} and TP*PP = {tp * pp}")
    if gpus > gpn and gpus % gpn:
        raise WorkloadError(f"--gpus {gpus} is not a whole number of {gpn}-GPU nodes")
    span = etp * ep
    if gpn % etp or (span % gpn and gpn % span):
        raise WorkloadError(f"ETP {etp} x EP {ep} = {span} ranks neither divides nor is a multiple of "
                            f"{gpn} GPUs per node: EP groups would straddle nodes unevenly")
    return {"gpus": gpus, "gpus_per_node": gpn, "nodes": max(1, gpus // gpn), "tp": tp, "etp": etp, "ep": ep,
            "pp": pp, "dp": gpus // (tp * pp), "expert_dp": gpus // (etp * ep * pp), "ep_span_ranks": span,
            "ep_nodes": max(1, span // gpn), "ep_ranks_per_node": min(ep, gpn // etp),
            "leaves_nvlink_domain": span > gpn}


def _split(per: dict, scale: float) -> dict:
    """Per-rank counts (tensors over ranks) -> mean and max of total/local/nvlink/net, scaled."""
    local = per["pairs"] - per["remote_pairs"]
    parts = {"total": per["pairs"], "local": local, "nvlink": per["nvlink_pairs"], "net": per["net_pairs"]}
    mean = {k: v.double().mean().item() * scale for k, v in parts.items()}
    tot = sum(mean[k] for k in ("local", "nvlink", "net")) or 1.0
    return {"mean": mean, "max": {k: v.max().item() * scale for k, v in parts.items()},
            "fraction": {k: mean[k] / tot for k in ("local", "nvlink", "net")},
            "_nvlink_r": per["nvlink_pairs"].double() * scale, "_net_r": per["net_pairs"].double() * scale}


def pair_counts(w: Workload, budget: int = SAMPLE_BUDGET) -> dict:
    """Generate every EP rank's routing (sampled tokens for large EP) and count pairs by the byte rule.

    Returns {sampled_tokens, dispatch: split, combine: split, bytes: {phase: phase_bytes (scaled)}}.
    """
    if w.ep * w.num_experts > MAX_EP_EXPERTS:
        raise WorkloadError(f"EP {w.ep} x {w.num_experts} experts = {w.ep * w.num_experts}: plan draws every EP rank's "
                            f"routing over every expert and takes EP x experts <= {MAX_EP_EXPERTS} (EP 1024 with "
                            "1024 experts), past any MoE layout in use")
    ts = min(w.num_tokens, max(MIN_SAMPLE, budget // (w.ep * w.num_experts)))
    ws = w.replace(num_tokens=ts)
    routings = [make_routing(ws, r)[0] for r in range(w.ep)]
    t = traffic.traffic_of(routings, ws)
    back = traffic.Traffic(t.pairs_SD.T.contiguous(), t.slots_SD.T.contiguous(), t.gpus_per_node)
    scale = w.num_tokens / ts
    out = {"sampled_tokens": ts, "dispatch": _split(t.per_rank(), scale), "combine": _split(back.per_rank(), scale)}
    out["dispatch"]["mean"]["net_node_dedup"] = _node_dedup(routings, ws) * scale
    out["bytes"] = {p: {k: v * scale for k, v in traffic.phase_bytes(t, ws, p, dedup=True).items()} for p in
                    ("dispatch", "combine")}
    return out


def _node_dedup(routings: list[torch.Tensor], w: Workload) -> float:
    """Network rows per GPU when a backend sends each token once per destination *node* (DeepEP and
    HybridEP internode forward over NVLink inside the node): (token, node) pairs from other nodes,
    counted with the byte rule at node granularity, shared by the node's EP ranks."""
    per_node = w.gpus_per_node
    nodes = w.ep // per_node if w.ep > per_node else 1
    if nodes == 1:
        return 0.0
    wn = w.replace(ep=nodes, gpus_per_node=1)
    rows = torch.stack([traffic.count_pairs(idx, wn)[0] for idx in routings])        # [EP src, node]
    src_node = torch.arange(w.ep) // per_node
    remote = src_node[:, None] != torch.arange(nodes)[None, :]
    return (rows * remote).sum().item() / w.ep


def predict_us(w: Workload, counts: dict, nvlink_gbps: float, net_gbps: float) -> dict:
    """Per phase: max over ranks of max(nvlink bytes / NVLink, net bytes / network), in us."""
    out = {}
    for phase in ("dispatch", "combine"):
        bpt = w.bytes_per_token if phase == "dispatch" else 2 * w.hidden
        c = counts[phase]
        t_r = torch.maximum(c["_nvlink_r"] * bpt / (nvlink_gbps * 1e9), c["_net_r"] * bpt / (net_gbps * 1e9))
        out[phase] = t_r.max().item() * 1e6
    return out


def measured_links(records: list[dict], w: Workload) -> dict:
    """Effective GB/s per backend from results: NVLink-only rows give busbw, cross-node rows net GB/s.
    Rows with the workload's H, K and dtype are preferred; among them the T nearest the workload's."""
    out: dict = {}
    good = [r for r in records if schema.timed(r) and r.get("phase") in schema.PHASES
            and schema.traffic(r).get("bus_bytes")]
    same = [r for r in good if all(r["workload"].get(k) == getattr(w, k) for k in ("hidden", "topk", "dtype"))]
    for r in sorted(same or good, key=lambda r: abs(r["workload"]["num_tokens"] - w.num_tokens), reverse=True):
        tr = r["traffic"]
        d = out.setdefault(schema.name(r), {}).setdefault(r["phase"], {})
        if tr.get("net_bytes"):
            d["net_GBps"] = tr.get("net_GBps")
        else:
            d["nvlink_GBps"] = tr.get("busbw_GBps")
    return out


MEMORY_BACKENDS = ("alltoall", "deepep", "hybridep")
SHAPE_KEYS = ("num_tokens", "hidden", "topk", "dtype", "num_experts", "ep")


def estimate_footprint(name: str, w: Workload, pairs_per_rank: float) -> int:
    """A backend's memory per GPU at this shape, estimated (mean rank): its own buffers (Backend.buffer_bytes,
    the size the pre-launch check assumes), the tokens in (x), the rows it hands the experts and their outputs,
    the combine output, and one call's working room ((P + R) rows deduplicating, (S + 2R) otherwise)."""
    from .backends import base
    from .harness import preflight
    cls = base.get(name)
    T, H, b = w.num_tokens, w.hidden, w.bytes_per_token
    S = R = T * w.topk
    call = preflight.call_bytes(cls.dedup, S, R, pairs_per_rank, b)
    return int(cls.buffer_bytes(w) + T * b + R * b + 2 * R * H + 2 * T * H + call)


def memory(w: Workload, records: list[dict], pairs_per_rank: float) -> list[dict]:
    """Per backend, its footprint per GPU at this shape: measured where a record of exactly this shape holds
    one (moebench.dispatch records it), else estimated, and said so."""
    shape = {k: getattr(w, k) for k in SHAPE_KEYS}
    names = list(dict.fromkeys([*MEMORY_BACKENDS, *(schema.name(r) for r in records)]))
    out = []
    for name in names:
        rec = next((r for r in reversed(records) if schema.name(r) == name and schema.footprint_bytes(r)
                    and all(r["workload"].get(k) == v for k, v in shape.items())), None)
        if rec:
            out.append({"backend": name, "bytes": schema.footprint_bytes(rec),
                        "source": f"measured ({rec.get('_file')}:{rec.get('_line')})"})
        elif not name.startswith("mcore-"):
            out.append({"backend": name, "bytes": estimate_footprint(name, w, pairs_per_rank),
                        "source": "estimated (no record of this shape; moebench.dispatch measures it)"})
    return out


def inside_ep(w: Workload, gpn: int, etp: int) -> int:
    """The largest EP that divides the experts and keeps ETP*EP within one node."""
    return max(e for e in range(1, w.num_experts + 1) if w.num_experts % e == 0 and e * etp <= gpn)


def gpu_memory_bytes(gpu: str, gib: float | None = None) -> float | None:
    """Memory per GPU: `gib` (--gpu-memory-gib), else the nominal size of the --gpu SKU; None when unknown."""
    return gib * 2**30 if gib is not None else ceilings.nominal_memory_bytes(gpu)


def plan(w: Workload, lay: dict, nvlink_gbps: float, net_gbps: float, records: list[dict] | None = None,
         budget: int = SAMPLE_BUDGET, gpu: str = "H200", gpu_gib: float | None = None) -> dict:
    """The whole plan as a JSON-ready dict (see module docstring)."""
    counts = pair_counts(w, budget)
    pred = {"nominal": predict_us(w, counts, nvlink_gbps, net_gbps)}
    dedup = counts["dispatch"]["mean"]["net_node_dedup"]
    if dedup:
        m = counts["dispatch"]["mean"]          # network rows are forwarded over NVLink inside the node
        nvl = (m["nvlink"] + m["net"]) * w.bytes_per_token / (nvlink_gbps * 1e3)
        pred["nominal, network deduplicated per node (mean rank)"] = {
            "dispatch": max(nvl, dedup * w.bytes_per_token / (net_gbps * 1e3))}
    for name, phases in measured_links(records or [], w).items():
        pred[f"measured:{name}"] = {p: predict_us(w, counts, v.get("nvlink_GBps") or nvlink_gbps,
                                                  v.get("net_GBps") or net_gbps)[p] for p, v in phases.items()}
    out = {"layout": lay, "workload": w.asdict(), "sampled_tokens": counts["sampled_tokens"],
           "pairs": {p: {k: v for k, v in counts[p].items() if not k.startswith("_")} for p in ("dispatch", "combine")},
           "bytes": counts["bytes"], "links": {"nvlink_GBps": nvlink_gbps, "net_GBps": net_gbps},
           "predicted_us": pred, "gpu": {"name": gpu, "memory_bytes": gpu_memory_bytes(gpu, gpu_gib)},
           "memory_per_gpu": memory(w, records or [], counts["dispatch"]["mean"]["total"])}
    out["advice"] = advice(w, lay, out, nvlink_gbps, net_gbps, budget)
    return out


def memory_advice(p: dict) -> tuple[list[str], bool]:
    """(advice on memory, whether no backend fits): which footprints exceed the GPU's memory."""
    gpu, have, mem = p["gpu"]["name"], p["gpu"]["memory_bytes"], p["memory_per_gpu"]
    if have is None:
        return [f"no memory size known for GPU {gpu!r}: pass --gpu-memory-gib to check that this shape fits"], False
    over = [m for m in mem if m["bytes"] > have]
    if not over:
        return [], False
    need = ", ".join(f"{m['backend']} ~{m['bytes'] / 2**30:,.1f} GiB" for m in over)
    fits = [m["backend"] for m in mem if m not in over]
    tail = (f"only {', '.join(fits)} fits" if fits else
            "lower --num-tokens (tokens per rank: more DP ranks share the batch), --hidden or --topk")
    return [f"does not fit: {need} per GPU, more than the GPU's {have / 2**30:g} GiB ({gpu}); {tail}"], not fits


def advice(w: Workload, lay: dict, p: dict, nvlink_gbps: float, net_gbps: float, budget: int) -> list[str]:
    """Memory first: a shape no backend fits gets only that; else the layout's advice, then memory's."""
    mem, none_fit = memory_advice(p)
    return mem if none_fit else layout_advice(w, lay, p, nvlink_gbps, net_gbps, budget) + mem


def layout_advice(w: Workload, lay: dict, p: dict, nvlink_gbps: float, net_gbps: float, budget: int) -> list[str]:
    gpn, etp, ep = lay["gpus_per_node"], lay["etp"], lay["ep"]
    t = p["predicted_us"]["nominal"]
    if not lay["leaves_nvlink_domain"]:
        return [f"EP {ep} x ETP {etp} = {lay['ep_span_ranks']} ranks fits in one {gpn}-GPU NVLink domain: "
                f"dispatch/combine stay on NVLink (predicted {t['dispatch']:.0f} / {t['combine']:.0f} us at "
                f"{nvlink_gbps:g} GB/s). Keep it there; scale out with DP (expert-DP {lay['expert_dp']}) and PP."]
    frac = p["pairs"]["dispatch"]["fraction"]["net"]
    ep_in = inside_ep(w, gpn, etp)
    out = [f"EP groups leave the NVLink domain: ETP {etp} x EP {ep} = {lay['ep_span_ranks']} consecutive ranks "
           f"span {lay['ep_nodes']} nodes; {frac:.0%} of received pairs cross the network at {net_gbps:g} GB/s "
           f"per GPU (NVLink {nvlink_gbps:g}): predicted dispatch {t['dispatch']:.0f} us, combine "
           f"{t['combine']:.0f} us."]
    if ep_in >= 1 and ep_in != ep:
        w_in = w.replace(ep=ep_in)
        t_in = predict_us(w_in, pair_counts(w_in, budget), nvlink_gbps, net_gbps)
        out.append(f"With EP {ep_in} (inside a node; {w.num_experts // ep_in} experts per GPU instead of "
                   f"{w.local_experts}) the same tokens would take {t_in['dispatch']:.0f} / {t_in['combine']:.0f} us: "
                   f"keep EP x ETP <= {gpn} and scale out with DP and PP.")
    out.append("If EP this large is needed (expert memory), use a backend that forwards over NVLink inside the "
               "node (DeepEP internode, HybridEP multinode) and node-limited routing (group:G:M with groups "
               "aligned to nodes) so each token crosses the network to few nodes.")
    return out


def format_text(p: dict) -> str:
    lay, w = p["layout"], p["workload"]
    lines = [f"# plan: {lay['gpus']} GPUs ({lay['nodes']} nodes x {lay['gpus_per_node']}), TP {lay['tp']}, "
             f"ETP {lay['etp']}, EP {lay['ep']}, PP {lay['pp']}, DP {lay['dp']}, expert-DP {lay['expert_dp']}",
             f"# workload: T={w['num_tokens']} H={w['hidden']} E={w['num_experts']} K={w['topk']} "
             f"{w['dtype']} {w['routing']} (counts from {p['sampled_tokens']} sampled tokens per rank)",
             f"# EP group: {lay['ep_span_ranks']} consecutive ranks on {lay['ep_nodes']} node(s), "
             f"{lay['ep_ranks_per_node']} EP ranks per node; leaves the NVLink domain: "
             f"{'YES' if lay['leaves_nvlink_domain'] else 'no'}"]
    lines.append(f"{'phase':<9} {'pairs/rank':>11} {'local':>9} {'nvlink':>9} {'net':>9} {'net max':>9} "
                 f"{'local%':>7} {'nvlink%':>7} {'net%':>6}")
    for phase in ("dispatch", "combine"):
        m, f, mx = (p["pairs"][phase][k] for k in ("mean", "fraction", "max"))
        lines.append(f"{phase:<9} {m['total']:11.1f} {m['local']:9.1f} {m['nvlink']:9.1f} {m['net']:9.1f} "
                     f"{mx['net']:9.1f} {f['local']:7.1%} {f['nvlink']:7.1%} {f['net']:6.1%}")
    for src, ph in p["predicted_us"].items():
        lines.append(f"predicted ({src}): " + ", ".join(f"{k} {v:.1f} us" for k, v in ph.items()))
    lines.append(f"# links: NVLink {p['links']['nvlink_GBps']:g} GB/s, network {p['links']['net_GBps']:g} GB/s "
                 "per GPU per direction")
    lines += [f"memory per GPU ({m['backend']}): {m['bytes'] / 2**30:.2f} GiB, {m['source']}" for m in p["memory_per_gpu"]]
    lines += [f"advice: {a}" for a in p["advice"]]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m moebench.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=cli.count(), help="total GPUs (default: ETP*EP*PP)")
    p.add_argument("--gpus-per-node", type=cli.count(), default=8, help="GPUs per node = NVLink domain (default 8)")
    p.add_argument("--ep", type=cli.count(), required=True, help="expert-parallel size")
    p.add_argument("--tp", type=cli.count(), default=1, help="tensor-parallel size")
    p.add_argument("--etp", type=cli.count(), help="expert tensor-parallel size (Megatron's default: TP)")
    p.add_argument("--pp", type=cli.count(), default=1, help="pipeline-parallel size")
    p.add_argument("--gpu", default="H200", help="GPU SKU for the nominal NVLink speed and memory (default H200)")
    p.add_argument("--gpu-memory-gib", type=cli.number(0, strict=True, high=1e5),
                   help="memory per GPU in GiB, to check the shape fits (default: that of --gpu)")
    p.add_argument("--nvlink-gbps", type=cli.number(GBPS_RANGE[0], high=GBPS_RANGE[1]),
                   help="NVLink GB/s per GPU per direction (default: nominal)")
    p.add_argument("--net-gbps", type=cli.number(GBPS_RANGE[0], high=GBPS_RANGE[1]),
                   help=f"network GB/s per GPU (default {ceilings.NIC_NOMINAL_GBPS:g})")
    p.add_argument("--results", nargs="+", metavar="JSONL", help="measured results: predict from their busbw")
    add_shape_args(p)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--routing", default="uniform", help="as moebench.dispatch (group:G:M for node-limited)")
    p.add_argument("--seed", type=cli.seed, default=0)
    p.add_argument("--sample-budget", type=cli.count(), default=SAMPLE_BUDGET, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


@cli.tool
def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        check_limits(a)
        etp = a.tp if a.etp is None else a.etp
        lay = layout(a.gpus if a.gpus is not None else etp * a.ep * a.pp, a.gpus_per_node, a.ep, a.tp, etp, a.pp)
        w = Workload(num_tokens=a.num_tokens, hidden=a.hidden, num_experts=a.num_experts, topk=a.topk, ep=a.ep,
                     dtype=a.dtype, routing=a.routing, seed=a.seed, gpus_per_node=a.gpus_per_node // etp)
        nvl = a.nvlink_gbps if a.nvlink_gbps is not None else ceilings.nominal_nvlink(a.gpu)
        if not nvl:
            raise WorkloadError(f"no nominal NVLink speed for GPU {a.gpu!r}: pass --nvlink-gbps")
        records = _read(a.results) if a.results else None
        net = a.net_gbps if a.net_gbps is not None else ceilings.NIC_NOMINAL_GBPS
        p = plan(w, lay, nvl, net, records, a.sample_budget, a.gpu, a.gpu_memory_gib)
    except WorkloadError as e:
        cli.error("moebench.plan", e)
        return 2
    print(json.dumps(p, indent=1) if a.json else format_text(p))
    return 0


def check_limits(a: argparse.Namespace) -> None:
    """WorkloadError naming the first flag past what a real plan can have (LIMITS)."""
    for name, (high, why) in LIMITS.items():
        v = getattr(a, name)
        if v is not None and v > high:
            raise WorkloadError(f"--{name.replace('_', '-')} must be at most {high} ({why}), got {v}")


def _read(paths: list[str]) -> list[dict]:
    """The records of --results that are measurements: CPU and shared-GPU records are functional only
    (left out with a note; refused when nothing else is there)."""
    try:
        recs = reader.read_dispatch(paths, "moebench.plan", need=PLAN_NEEDS, verdict=True)
    except reader.RecordError as e:
        raise WorkloadError(f"--results {e}") from None
    if not (recs := schema.performance_only(recs, "plan --results")):
        raise WorkloadError(f"--results: every record is {schema.FUNCTIONAL_NOTE}: measure on the target GPUs "
                            "or leave --results out (nominal link speeds)")
    if not any(schema.timed(r) and (schema.traffic(r).get("bus_bytes") or schema.footprint_bytes(r)) for r in recs):
        raise WorkloadError("--results: no PASS record with timed traffic across links (EP 1 moves no byte over a "
                            "link) or a measured footprint: nothing to predict from; leave --results out for nominal "
                            "link speeds")
    return recs


if __name__ == "__main__":
    sys.exit(cli.run(main, "moebench.plan"))
