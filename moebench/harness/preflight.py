"""Checks made before any rank starts, so that a backend which cannot run here costs no launch.

- A backend that cannot run on CPU says so (Backend.cpu_problem: Megatron-Core's token dispatchers
  need CUDA): on a CPU run it is WAIVED here, not after its ranks start, import megatron-core and give up.
- Memory: an estimate of what one case needs, host memory on CPU and device memory per GPU on
  CUDA, against what this machine has. It is an estimate, not a measurement: the sum of the large
  tensors a rank holds at its peak (below), plus a fixed cost per rank process, times the ranks that
  share the memory. A named backend that does not fit is refused (exit 2, spec.check); with
  `--backend all` it is WAIVED; a sweep skips the case. The estimate and what is available are named.

Per rank, with T tokens, H hidden, K top-k, b payload bytes per row (bf16 2H, fp8 H + H/32), S
slots sent, R (token, expert) rows received, P (token, rank) pairs received, M rows of the rank's
busiest local expert (counts from the case's own routing, as the byte rule counts them):
  held:      x (2TH), the oracle's expected rows (R b), the dispatched rows (R b), the expert
             outputs (2RH) and the combine output (2TH)
  peak of:   the oracle's combine, fp32 [T, K, H] products (8TKH + 4TH; with the chained view also its last
             pair's outputs, alive while the oracle checks them: one backend call's bytes); the dispatch check's row
             keys of one expert (24MH); one backend call (alltoall-like: (S + 2R) b; deduplicating
             backends: (P + R) b)
  on CUDA:   the L2 flush buffer, a CUDA context, and the buffers the backend declares
             (Backend.buffer_bytes; deepep-ll: its RDMA buffer and [E, T, H] receive slots; deepep,
             hybridep: receive room for every rank's tokens, EP x T x (b + 2H), an assumption, not
             DeepEP's or HybridEP's own size rule)
On CPU this was checked against the peak RSS of the ranks (tests/test_robust_preflight.py): the
estimate read 0.8-1.0 of it for 2 and 8 ranks, so a case close to the limit may still be killed;
its FAIL then says that the kill was likely for memory (launch.py).

Before any of that, what every backend needs alike (`workload_problem`, whatever --backend names): each
rank draws its routing scores (fp32 [T, E]) and tokens (fp32 [T, H]) on the host, and the parent draws
every rank's routing once more for the byte rule; an explicit `--overlap gemm:MxNxK` adds its operands.
A workload past that is refused before the parent draws anything (an allocator traceback before).

Ranks started by torchrun/Slurm each decide alone, so the memory check is skipped there.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

from ..backends import base
from ..core.workload import Workload, make_routing
from . import overlap
from .launch import joined_env
from .timing import L2_FLUSH_BYTES

GiB = 2**30
RANK_PROCESS_HOST = 240 * 2**20      # a CPU rank: Python, torch and a gloo group (RSS, measured)
RANK_CONTEXT_CUDA = 512 * 2**20      # a CUDA context and NCCL's buffers per GPU rank (rough)
CHECK_KEY_BYTES = 24                 # int32 row keys of got + expected (4 + 4), int64 hash terms (8 + 8)


def needs_cuda(name: str, spec) -> str:
    """Why a backend cannot run on this run's device ('' when it can): what the backend declares."""
    return base.get(name).cpu_problem(spec.backend_knobs) if spec.device != "cuda" else ""


@functools.lru_cache(maxsize=16)
def routing_counts(w: Workload) -> dict[str, list[int]]:
    """Per rank: slots sent, (token, expert) rows and (token, rank) pairs received, and the rows of
    its busiest local expert, from every rank's routing."""
    W, L = w.ep, w.local_experts
    per_expert = torch.zeros(w.num_experts, dtype=torch.int64)
    pairs = torch.zeros(W, dtype=torch.int64)
    sent = []
    for r in range(W):
        idx = make_routing(w, r)[0]
        valid = idx >= 0
        sent.append(int(valid.sum()))
        per_expert += torch.bincount(idx[valid], minlength=w.num_experts)
        hit = torch.zeros(idx.shape[0], W, dtype=torch.bool)
        hit.scatter_(1, torch.where(valid, idx // L, 0), valid)
        pairs += hit.sum(0)
    by_rank = per_expert.view(W, L)
    return {"sent": sent, "rows": by_rank.sum(1).tolist(), "pairs": pairs.tolist(),
            "busiest": by_rank.max(1).values.tolist()}


def call_bytes(dedup: bool, sent: float, rows: float, pairs: float, row_bytes: int) -> int:
    """One backend call's working room: a deduplicating backend holds the (token, rank) pairs it receives and
    the rows it hands out ((P + R) b); an alltoall-like one the slots it sends and twice the rows ((S + 2R) b)."""
    return int((pairs + rows) * row_bytes if dedup else (sent + 2 * rows) * row_bytes)


def rank_bytes(name: str, dedup: bool, w: Workload, c: dict, r: int, cuda: bool, chained: bool = False) -> int:
    """The estimate for rank r (see the module docstring); chained: the chained view is timed (its last pair's
    outputs are alive while the oracle checks them)."""
    T, H, K, b = w.num_tokens, w.hidden, w.topk, w.bytes_per_token
    S, R, P, M = c["sent"][r], c["rows"][r], c["pairs"][r], c["busiest"][r]
    held = 2 * T * H + (T * H if w.dtype == "fp8" else 0) + 2 * R * b + 2 * R * H + 2 * T * H
    call = call_bytes(dedup, S, R, P, b)
    peak = max(8 * T * K * H + 4 * T * H + (call if chained else 0), CHECK_KEY_BYTES * M * H, call, draw_bytes(w))
    if not cuda:
        return held + peak + RANK_PROCESS_HOST
    extra = L2_FLUSH_BYTES + RANK_CONTEXT_CUDA
    return held + peak + extra + base.get(name).buffer_bytes(w)


@dataclass
class Estimate:
    per_rank: list[int]       # bytes each rank needs
    ranks_per_pool: int       # ranks sharing one memory: all of them on CPU, ranks_per_gpu on CUDA
    where: str                # "host memory" | "device memory per GPU"

    @property
    def need(self) -> int:
        """The fullest pool: on CPU every rank, on CUDA the ranks of the busiest GPU."""
        n = self.ranks_per_pool
        return max(sum(self.per_rank[i:i + n]) for i in range(0, len(self.per_rank), n))


def draw_bytes(w: Workload) -> int:
    """The fp32 routing scores [T, E] and tokens [T, H] a rank draws on the host (make_routing, make_tokens)."""
    return 4 * w.num_tokens * (w.num_experts + w.hidden)


def gemm_bytes(spec, rows: int, cuda: bool) -> int:
    """The --overlap GEMM's operands and output on a rank ([M, K], [K, N], [M, N]; bf16 on CUDA, fp32 on CPU); M
    is the rows the rank received unless the spec names the shape. 0 without --overlap."""
    shape = overlap.parse(spec.overlap)
    if shape is None:
        return 0
    M, N, K = overlap.gemm_shape(shape, rows, spec.workload.hidden)
    return (2 if cuda else 4) * (M * K + K * N + M * N)


def estimate(name: str, dedup: bool, spec) -> Estimate:
    w, cuda = spec.workload, spec.device == "cuda"
    c = routing_counts(w)
    chained = "chained" in spec.views
    per = [rank_bytes(name, dedup, w, c, r, cuda, chained) + gemm_bytes(spec, c["rows"][r], cuda) for r in range(w.ep)]
    if cuda:
        return Estimate(per, max(1, spec.ranks_per_gpu), "device memory per GPU")
    return Estimate(per, w.ep, "host memory")


def available_bytes(device: str) -> int | None:
    """Host: MemAvailable; CUDA: the smallest GPU's total memory. None when it cannot be read."""
    if device == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return min((torch.cuda.get_device_properties(i).total_memory for i in range(n)), default=None)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None


def workload_problem(spec) -> str:
    """'' when what every backend needs fits (the module docstring), or nothing can be said; else one line.
    Counted without drawing anything: a shape of 10^12 tokens is refused here, not by the allocator."""
    if joined_env() is not None:
        return ""
    explicit = isinstance(overlap.parse(spec.overlap), tuple)
    return inputs_problem(spec.workload, spec.workload.ep, gemm_bytes(spec, 1, False) if explicit else 0)


def inputs_problem(w: Workload, ranks: int, gemm: int = 0) -> str:
    """workload_problem for `ranks` local ranks, each with `gemm` bytes of GEMM besides (check's round trips too)."""
    have = available_bytes("cpu")
    need = (ranks + 1) * draw_bytes(w) + ranks * gemm
    if have is not None and need > have:
        return (f"EP {ranks} with T={w.num_tokens} H={w.hidden} E={w.num_experts} needs ~{need / GiB:.1f} GiB of host "
                f"memory before any backend runs (each rank draws fp32 routing scores [T, E] and tokens [T, H]"
                f"{', and the --overlap GEMM' if gemm else ''}), {have / GiB:.1f} GiB available: lower --num-tokens, "
                f"--num-experts or --hidden{' or the GEMM shape' if gemm else ''}")
    return ""


def memory_problem(name: str, dedup: bool, spec) -> str:
    """'' when the case fits (or nothing can be said); else one line with the estimate and what is there."""
    if joined_env() is not None:
        return ""
    first = workload_problem(spec)
    if first:
        return first
    w, have = spec.workload, available_bytes(spec.device)
    if have is None:
        return ""
    e = estimate(name, dedup, spec)
    if e.need <= have:
        return ""
    shared = f"{e.ranks_per_pool} ranks, up to {max(e.per_rank) / GiB:.1f} GiB each" if e.ranks_per_pool > 1 else "1 rank"
    there = "available" if spec.device == "cpu" else "on the GPU"
    return (f"{name} on EP {w.ep} needs ~{e.need / GiB:.1f} GiB of {e.where} (an estimate: {shared}; the "
            f"oracle's fp32 [T, K, H] products, payload copies, the rank processes), {have / GiB:.1f} GiB {there}: "
            "lower --num-tokens, --hidden, --topk or --ep" + (", or run on GPUs" if spec.device == "cpu" else ""))


def ops_impl_problem(spec) -> str:
    """'' unless --ops-impl names an implementation this run's device cannot run (cuda on a CPU run, triton on
    CPU without its interpreter, or either where ops.impl_status says no): a named one is bad input for every
    backend, not a FAIL from inside the ranks."""
    from .. import ops
    bad_env = ops.env_problem({**os.environ, **spec.env})       # --knob env:VAR=V too: the ranks read it
    if bad_env:
        return bad_env
    impl = str(spec.knobs.get("ops_impl", "auto")).partition("@")[0]
    if impl in ("auto", "torch"):
        return ""
    if spec.device == "cpu":
        if impl == "cuda":
            return "--ops-impl cuda runs on GPUs and this run is on CPU: use --ops-impl torch (or auto)"
        if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
            return ("--ops-impl triton on a CPU run needs triton installed and TRITON_INTERPRET=1 (its interpreter, "
                    "slow): use --ops-impl torch (or auto)")
        return ""
    ok, why = ops.impl_status()[impl]
    return "" if ok else f"--ops-impl {impl} cannot run here ({why}): use --ops-impl auto"


def waiver(name: str, spec) -> str:
    """Why a backend that is installed and takes the shape still cannot run here ('' when it can):
    runner.waiver's last check, made before any rank starts."""
    return needs_cuda(name, spec) or memory_problem(name, base.get(name).dedup, spec)


def refusal(name: str, spec) -> str:
    """For a backend named on the command line (bad input, exit 2): the memory problem of one that
    would otherwise run here; '' when it fits, or when it will be WAIVED anyway."""
    cls = base.get(name)
    if not cls.available()[0] or needs_cuda(name, spec):
        return ""
    return memory_problem(name, cls.dedup, spec)
