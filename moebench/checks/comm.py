"""Link and communication-library checks: `p2p` (moebench/csrc/probes/p2p_bw.cu) and `nccl` (nvshmem.py
has the NVSHMEM check).

The p2p probe is a standalone CUDA program. The check uses, in order: $MOEBENCH_P2P_PROBE, a binary
built by CMake (build/**/p2p_bw), or compiles moebench/csrc/probes/p2p_bw.cu with nvcc into
~/.cache/moebench/probes/ (keyed by the source's hash). It does not use cupy. Everything native runs
in a contained child process (child.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path

from ..core import ceilings
from ..env.toolkit import CSRC_DIR, find_nvcc
from . import child
from .registry import Context, failed, passed, register, waived

PROBE_SRC = CSRC_DIR / "probes" / "p2p_bw.cu"
P2P_MIN_FRAC = 0.6          # a pair below this fraction of the nominal NVLink ceiling fails
P2P_MIN_OF_MEDIAN = 0.8     # ... and so does a pair this far below the median pair (a degraded link)


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def probe_binary(timeout_s: float = 300.0) -> tuple[str | None, str]:
    """(path to a runnable p2p_bw, how it was found) or (None, why not)."""
    env = os.environ.get("MOEBENCH_P2P_PROBE")
    if env:
        return (env, "$MOEBENCH_P2P_PROBE") if Path(env).exists() else (None, f"$MOEBENCH_P2P_PROBE={env} missing")
    built = sorted((child.REPO_ROOT / "build").glob("**/p2p_bw"))
    if built:
        return str(built[0]), "CMake build"
    if not PROBE_SRC.exists():
        return None, f"{PROBE_SRC} not found (installed without csrc/)"
    nvcc = find_nvcc()
    if nvcc is None:
        return None, "nvcc not found (set CUDA_HOME) and no prebuilt p2p_bw"
    tag = hashlib.sha1(PROBE_SRC.read_bytes()).hexdigest()[:12]
    out = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moebench" / "probes" / f"p2p_bw-{tag}"
    if out.exists():
        return str(out), "cached nvcc build"
    out.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for arch in (["-arch=native"], []):
        r = child.run_argv([nvcc, "-O3", "-std=c++17", *arch, "-o", str(out) + ".tmp", str(PROBE_SRC)], timeout_s)
        if r.returncode == 0:
            os.replace(str(out) + ".tmp", out)
            return str(out), f"compiled with {nvcc} {' '.join(arch)}".strip()
        errors.append(r.failure() or r.stderr_tail(3))
    return None, f"nvcc failed: {errors[-1]}"


def _probe_json(text: str) -> dict | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and "copy_GBps" in data else None


def judge_p2p(data: dict, nominal: float | None) -> tuple[list[str], list[dict]]:
    """Problems and bandwidth rows from the probe's JSON (pairs only; the diagonal is informative)."""
    n = len(data["devices"])
    problems, rows = [], []
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    for s, d in pairs:
        if not data["can_access"][s][d]:
            problems.append(f"GPU {s} cannot access GPU {d} (no peer access)")
    bws = [data["copy_GBps"][s][d] for s, d in pairs if data["copy_GBps"][s][d] is not None]
    median = statistics.median(bws) if bws else None
    for s, d in pairs:
        bw = data["copy_GBps"][s][d]
        if bw is None:
            continue
        rows.append({"workload": f"p2p {data['bytes']} B", "backend": "sm-copy", "phase": f"{s}->{d}", "GBps": bw})
        if nominal and bw < P2P_MIN_FRAC * nominal:
            problems.append(f"{s}->{d}: {bw:.0f} GB/s < {P2P_MIN_FRAC:.0%} of nominal {nominal:.0f}")
        elif median and bw < P2P_MIN_OF_MEDIAN * median:
            problems.append(f"{s}->{d}: {bw:.0f} GB/s < {P2P_MIN_OF_MEDIAN:.0%} of the median pair {median:.0f}")
    return problems, rows


@register("p2p", "peer-access matrix and SM-driven copy GB/s per GPU pair against the nominal NVLink ceiling")
def check_p2p(ctx: Context):
    n = gpu_count()
    if n == 0:
        return waived("no CUDA GPU visible")
    exe, how = probe_binary()
    if exe is None:
        return waived(f"p2p probe unavailable: {how}")
    mib = getattr(ctx.options, "p2p_mib", 256)
    r = child.run_argv([exe, "--bytes", str(mib << 20)], ctx.options.timeout)
    data = _probe_json(r.stdout) if r.returncode == 0 and not r.timed_out else None
    if data is None:
        return failed(f"p2p probe {r.failure() if r.returncode != 0 or r.timed_out else 'printed no JSON'}",
                      stderr=r.stderr_tail(), probe=how)
    local = [data["copy_GBps"][i][i] for i in range(len(data["devices"]))]
    if len(data["devices"]) < 2:
        return waived(f"1 GPU visible: no GPU pairs to measure (probe ran: local SM copy {local[0]:.0f} GB/s)",
                      probe=how, result=data)
    nominal = ceilings.nominal_nvlink(data["devices"][0])
    problems, rows = judge_p2p(data, nominal)
    if problems:
        return failed("; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""),
                      rows=rows, probe=how, result=data, nominal_GBps=nominal)
    bws = [r_["GBps"] for r_ in rows]
    frac = f", {min(bws) / nominal:.2f}-{max(bws) / nominal:.2f} of nominal {nominal:.0f}" if nominal else ""
    return passed(f"{len(bws)} pairs, {min(bws):.0f}-{max(bws):.0f} GB/s{frac}", rows=rows, probe=how,
                  result=data, nominal_GBps=nominal)


def _nccl_rank(ctx, nbytes: int, iters: int) -> dict:
    """On each rank: all_reduce and all_to_all_single correctness, then timed busbw."""
    import torch
    import torch.distributed as dist

    from ..harness.timing import Timer
    W, r, dev = ctx.world, ctx.rank, ctx.device
    n = nbytes // 4 // W * W
    x = torch.full((n,), float(r + 1), device=dev)
    dist.all_reduce(x)
    ok_ar = bool((x == W * (W + 1) / 2).all())
    chunk = n // W
    send = (torch.arange(W, device=dev, dtype=torch.float32) + 1000.0 * r).repeat_interleave(chunk)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    want = (torch.arange(W, device=dev, dtype=torch.float32) * 1000.0 + r).repeat_interleave(chunk)
    ok_a2a = bool(torch.equal(recv, want))
    timer = Timer(dev, ctx.group, flush_l2=False)
    t_ar = timer.run(lambda: dist.all_reduce(x), iters, 50).median_us * 1e-6
    t_a2a = timer.run(lambda: dist.all_to_all_single(recv, send), iters, 50).median_us * 1e-6
    b = n * 4
    return {"all_reduce": {"ok": ok_ar, "median_us": t_ar * 1e6, "busbw_GBps": b * 2 * (W - 1) / W / t_ar / 1e9},
            "all_to_all": {"ok": ok_a2a, "median_us": t_a2a * 1e6, "busbw_GBps": b * (W - 1) / W / t_a2a / 1e9},
            "bytes": b}


def nccl_child(world: int, nbytes: int, iters: int, timeout_s: float) -> list:
    from ..harness.launch import run_ranks
    return run_ranks(_nccl_rank, world, "cuda", timeout_s, args=(nbytes, iters))


@register("nccl", "NCCL all-reduce and all-to-all correctness and busbw over the visible GPUs")
def check_nccl(ctx: Context):
    n = gpu_count()
    if n < 2:
        return waived(f"needs 2+ GPUs, {n} visible")
    nbytes = getattr(ctx.options, "nccl_mib", 64) << 20
    r = child.run_function("moebench.checks.comm:nccl_child",
                           {"world": n, "nbytes": nbytes, "iters": 20, "timeout_s": ctx.options.timeout},
                           ctx.options.timeout + 30)
    if not r.ok:
        return failed(f"NCCL probe {r.failure()}", stderr=r.stderr_tail())
    ranks = r.value
    bad = [f"rank {i} {op}" for i, res in enumerate(ranks) for op in ("all_reduce", "all_to_all") if not res[op]["ok"]]
    r0 = ranks[0]
    rows = [{"workload": f"nccl {r0['bytes']} B x{n}", "backend": "nccl", "phase": op, "GBps": r0[op]["busbw_GBps"]}
            for op in ("all_reduce", "all_to_all")]
    if bad:
        return failed(f"wrong results: {', '.join(bad)}", rows=rows, ranks=ranks)
    return passed(f"{n} GPUs, {r0['bytes'] >> 20} MiB: all_reduce busbw {rows[0]['GBps']:.0f} GB/s, "
                  f"all_to_all busbw {rows[1]['GBps']:.0f} GB/s", rows=rows, ranks=ranks)
