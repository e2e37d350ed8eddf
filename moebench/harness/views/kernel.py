"""kernel: the communication kernels alone: their device time per call, averaged over profiled calls (DeepEP's
`bench_kineto`), per rank; `us` is rank 0's. Backend hooks: `comm_kernels`, the substrings of its communication
kernels' names (the local permute and weighting kernels are not among them); `kernel_view`:
  ""              the api call's own profile (each call behind the L2 flush, as the api view times it);
  "bench_kineto"  profiled as the backend's own test does (DeepEP V2 tests/elastic/test_ep.py, deep_ep/utils/
                  testing.py bench_kineto with barrier_comm_profiling): before each call the L2 flush, a ~10 ms
                  sleep kernel and the backend's barrier (the ranks meet on the GPU), so no rank's launch delay
                  is in another's kernel; the other kernels it reports apart (its copy / reduce epilogues) are
                  in `other_kernels_us`.
"""
from __future__ import annotations

import torch

from ..timing import kernel_profile
from . import PHASES, Case, figure, none
from .profile import per_rank

NAME, ORDER, SAMPLED = "kernel", 2, False
ABOUT = "the communication kernels alone"
AGG = ("device time of the communication kernels per call, mean over profiled calls (DeepEP bench_kineto); rank 0, "
       "and max over ranks")
KINETO_CALLS = 10
KINETO_SLEEP_CYCLES = int(2e7)      # bench_kineto's torch.cuda._sleep(int(2e7)), ~10 ms


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
    if b.kernel_view == "bench_kineto":
        return {p: one(case, bench_kineto(case, case.phases[p]), b.comm_kernels, kineto=True) for p in PHASES}
    return {p: one(case, case.rows.get(p) or [], b.comm_kernels) for p in PHASES}


def bench_kineto(case: Case, fn) -> list[dict]:
    """The phase's kernels per call, each call behind the L2 flush, a sleep kernel and the backend's barrier."""
    timer, b = case.timer, case.backend

    def lead():
        timer.lead()
        torch.cuda._sleep(KINETO_SLEEP_CYCLES)
        b.barrier()
    return kernel_profile(fn, True, n=KINETO_CALLS, top=0, lead=lead).rows


def one(case: Case, rows: list[dict], names: tuple[str, ...], kineto: bool = False) -> dict:
    """Every rank must call this (one collective)."""
    us, hit = comm_kernel_us(rows, names)
    r0, mx, found = per_rank(case.timer, us, case.rank, 1.0 if hit else 0.0)   # found: on any rank
    if not found:
        return none(f"no kernel named like {', '.join(names)} ran (e.g. EP 1, or gloo moves the bytes)")
    if not kineto:
        return figure(r0, mx, AGG, kernels=hit)
    others = {r["kernel"][:60]: round(r["us_per_iter"], 3) for r in rows if r["kernel"] not in hit}
    return figure(r0, mx, AGG + "; each call behind the L2 flush, a ~10 ms sleep kernel and the backend's barrier, "
                  f"{KINETO_CALLS} calls (test_ep.py's bench_kineto)", kernels=hit, other_kernels_us=others)
