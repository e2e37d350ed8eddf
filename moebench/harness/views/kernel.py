"""kernel: the communication kernels alone, from the api call's profile: their device time per call,
averaged over the profiled calls (DeepEP's `bench_kineto`), per rank; `us` is rank 0's. Backend hook:
`comm_kernels`, the substrings of its communication kernels' names (the local permute and weighting
kernels are not among them)."""
from __future__ import annotations

from . import PHASES, Case, figure, none
from .profile import per_rank

NAME, ORDER, SAMPLED = "kernel", 2, False
ABOUT = "the communication kernels alone"
AGG = ("device time of the communication kernels per call, mean over profiled calls (DeepEP bench_kineto); rank 0, "
       "and max over ranks")


def comm_kernel_us(rows: list[dict], names: tuple[str, ...]) -> tuple[float, list[str]]:
    """Device us per call of the kernels whose name holds one of `names`, and those kernels."""
    hit = [r for r in rows if any(n in r["kernel"] for n in names)]
    return sum(r["us_per_iter"] for r in hit), [r["kernel"] for r in hit]


def run(case: Case) -> dict:
    b = case.backend
    if not case.timer.cuda:
        return {p: none("CPU run: no GPU kernels") for p in PHASES}
    if not b.comm_kernels:
        return {p: none(f"{b.name} names no communication kernels") for p in PHASES}
    return {p: one(case, case.rows.get(p) or [], b.comm_kernels) for p in PHASES}


def one(case: Case, rows: list[dict], names: tuple[str, ...]) -> dict:
    """Every rank must call this (one collective)."""
    us, hit = comm_kernel_us(rows, names)
    r0, mx, found = per_rank(case.timer, us, case.rank, 1.0 if hit else 0.0)   # found: on any rank
    if not found:
        return none(f"no kernel named like {', '.join(names)} ran (e.g. EP 1, or gloo moves the bytes)")
    return figure(r0, mx, AGG, kernels=hit)
