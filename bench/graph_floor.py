"""The graph view's own floor on one GPU: what a phase of n kernels costs mark to mark inside a CUDA graph
over the sum of its kernels, with the graph view's structure (the L2 flush, a mark, the kernels, a mark;
views._capture) and the kernel sum the way the cached view's record takes it (timing.kernel_profile behind
the flush). The phase is n device copies of MB megabytes each (1 x 32 MB is a one-kernel combine, 3 a
route + route + permute dispatch); `mixed` is two 64 KB copies then one MB copy, the fp8 dispatch's shape.

    PYTHONPATH=. python bench/graph_floor.py [MB [OUT.jsonl]]     (from the repo root, one GPU)
Prints one line per chain: graph us, kernel-sum us, their difference and ratio; with OUT, one JSON record
per chain with provenance.
"""
import json
import statistics
import sys

import torch

from moebench.harness.timing import Timer, kernel_profile
from moebench.records.provenance import provenance

MB = int(sys.argv[1]) if len(sys.argv) > 1 else 32
OUT = sys.argv[2] if len(sys.argv) > 2 else None
CALLS, REPLAYS = 4, 25
dev = torch.device("cuda")
timer = Timer(dev)


def chain(sizes_bytes: list[int]):
    """A phase: one copy kernel per size, each from its own source into its own destination."""
    bufs = [(torch.ones(n // 4, device=dev), torch.empty(n // 4, device=dev)) for n in sizes_bytes]

    def fn():
        for src, dst in bufs:
            dst.copy_(src)
    return fn


def graph_us(fn) -> list[float]:
    """Per call mark to mark, CALLS calls captured per graph behind the flush, as the graph view times."""
    fn()
    torch.cuda.synchronize()
    marks = []

    def mark():
        marks.append(torch.cuda.Event(enable_timing=True, external=True))
        marks[-1].record()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            timer.lead()
            mark()
            fn()
            mark()
    us = []
    for _ in range(REPLAYS):
        g.replay()
        torch.cuda.synchronize()
        us += [a.elapsed_time(b) * 1e3 for a, b in zip(marks[0::2], marks[1::2])]
    return us


big = MB << 20
cases = {f"{n} x {MB} MB": [big] * n for n in (1, 2, 3, 4)} | {f"mixed 2 x 64 KB + {MB} MB": [64 << 10] * 2 + [big]}
prov = provenance()
for name, sizes in cases.items():
    fn = chain(sizes)
    g = statistics.median(graph_us(fn))
    rows = kernel_profile(fn, True, n=20, top=0, lead=timer.lead)
    k = sum(r["us_per_iter"] for r in rows)
    print(f"{name:>24}: graph {g:8.2f} us  kernel sum {k:8.2f} us  graph - kernels {g - k:5.2f} us  "
          f"ratio {g / k:.3f}  ({len(sizes)} kernels, {sum(r['calls_per_iter'] for r in rows):.0f} profiled)")
    if OUT:
        with open(OUT, "a") as f:
            f.write(json.dumps({"tool": "graph_floor", "case": name, "kernels": len(sizes), "bytes": sizes,
                                "graph_median_us": g, "kernel_sum_us": k, "calls_per_graph": CALLS,
                                "replays": REPLAYS, "kernel_rows": rows, "provenance": prov}) + "\n")
