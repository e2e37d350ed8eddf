"""The graph view's own floor on one GPU: what a phase of n kernels costs mark to mark inside a CUDA graph
over the sum of its kernels. The chain is timed by the graph view itself (views.graph: pairs captured in one
graph, the L2 flush before each phase, mark to mark; the chain stands in for both the dispatch and the combine)
and its kernel sum is taken as the cached view's record takes it (timing.kernel_profile behind the flush). The
phase is n kernels that each copy MB megabytes (negated) (1 x 32 MB is a one-kernel combine, 3 a route + route + permute
dispatch); `mixed` is two 64 KB copies then one MB copy, the fp8 dispatch's shape.

    PYTHONPATH=. python bench/graph_floor.py [MB [OUT.jsonl]]     (from the repo root, one GPU)
Prints one line per chain: graph us, kernel-sum us, their difference and ratio; with OUT, one JSON record
per chain with provenance.
"""
import json
import statistics
import sys
from types import SimpleNamespace

import torch

from moebench.backends.base import GraphPlan
from moebench.harness import views
from moebench.harness.timing import Timer, kernel_profile
from moebench.records.provenance import provenance

MB = int(sys.argv[1]) if len(sys.argv) > 1 else 32
OUT = sys.argv[2] if len(sys.argv) > 2 else None
CALLS, ITERS = 4, 100                  # pairs per graph, timed calls per phase
dev = torch.device("cuda")
timer = Timer(dev)


def chain(sizes_bytes: list[int]):
    """A phase: one elementwise kernel per size (a negating copy: a plain copy_ would be a memcpy node, not a
    kernel), each from its own source into its own destination; returns the last destination."""
    bufs = [(torch.ones(n // 4, device=dev), torch.empty(n // 4, device=dev)) for n in sizes_bytes]

    def fn():
        for src, dst in bufs:
            torch.neg(src, out=dst)
        return bufs[-1][1]
    return fn


def graph_us(fn) -> list[float]:
    """The chain's per-call samples from the graph view, in the dispatch's place and in the combine's."""
    plan = GraphPlan(mode="copy chain", dispatch=lambda: SimpleNamespace(x_RH=fn()), combine=lambda d: fn())
    g = views.graph(timer, plan, ITERS, 0, check=lambda d, y: "", wait_s=60, calls=CALLS)
    assert "samples_us" in g["dispatch"], g
    return g["dispatch"]["samples_us"] + g["combine"]["samples_us"]


big = MB << 20
cases = {f"{n} x {MB} MB": [big] * n for n in (1, 2, 3, 4)} | {f"mixed 2 x 64 KB + {MB} MB": [64 << 10] * 2 + [big]}
prov = provenance()
for name, sizes in cases.items():
    fn = chain(sizes)
    g = statistics.median(graph_us(fn))
    rows = kernel_profile(fn, True, n=20, top=0, lead=timer.lead).rows
    k = sum(r["us_per_iter"] for r in rows)
    print(f"{name:>24}: graph {g:8.2f} us  kernel sum {k:8.2f} us  graph - kernels {g - k:5.2f} us  "
          f"ratio {g / k:.3f}  ({len(sizes)} kernels, {sum(r['calls_per_iter'] for r in rows):.0f} profiled)")
    if OUT:
        with open(OUT, "a") as f:
            f.write(json.dumps({"tool": "graph_floor", "case": name, "kernels": len(sizes), "bytes": sizes,
                                "graph_median_us": g, "kernel_sum_us": k, "calls_per_graph": CALLS,
                                "calls_per_phase": ITERS, "kernel_rows": rows, "provenance": prov}) + "\n")
