"""Results: provenance of a run, writing JSONL, and the table printed to the terminal.

The records themselves (schema, fields, the reader) are in record.py.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from . import record
from .cli import shorten, sig3
from .toolkit import dist_version

ENV_ALLOWLIST = ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "NCCL_PROTO", "NCCL_ALGO", "NCCL_IB_HCA",
                 "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "CUDA_HOME",
                 "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "USE_MNNVL", "TRITON_INTERPRET",
                 "NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_sha() -> str | None:
    """HEAD of the checkout (+ '-dirty'); MOEBENCH_GIT_SHA overrides it for copies without history."""
    if os.environ.get("MOEBENCH_GIT_SHA"):
        return os.environ["MOEBENCH_GIT_SHA"]
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(sha) != 40:
        return None
    return sha + ("-dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def provenance() -> dict:
    """Versions and hardware of this process's machine; absent things are None, never an error."""
    import torch
    env = {
        "git_sha": git_sha(), "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "nccl": None, "triton": dist_version("triton"),
        "deep_ep": dist_version("deep_ep", "deep-ep"),
        "megatron_core": dist_version("megatron-core", "megatron_core"),
        "transformer_engine": dist_version("transformer_engine", "transformer-engine"),
        "hostname": socket.gethostname(), "driver": None, "gpu": None, "gpu_count": 0, "cc": None,
        "env": {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ},
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_count=torch.cuda.device_count(), cc=f"{p.major}.{p.minor}",
                   sms=p.multi_processor_count)
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a torch without NCCL
            pass
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    from .topology import nvml
    try:
        v = nvml().nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def repro_command(argv: list[str] | None, module: str) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join([f"python -m {module}", *args])


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Append records, one JSON object a line (every tool's --out appends)."""
    p = Path(path)
    if p.parent != Path(""):
        p.parent.mkdir(parents=True, exist_ok=True)
    ensure_newline(p)                  # a line cut short by a killed run stays its own (skipped) line
    with p.open("a") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")   # one write per whole line, flushed
            f.flush()


def ensure_newline(path: str | os.PathLike) -> None:
    """End a non-empty file with a newline, so the next record starts a line of its own."""
    p = Path(path)
    if p.is_file() and p.stat().st_size:
        with p.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            with p.open("a") as f:
                f.write("\n")


TABLE_COLUMNS = ("backend", "phase", "api us", "p90 us", "cached us", "kernel us", "algbw GB/s", "busbw GB/s",
                 "wirebw GB/s", "frac ceil", "check")
OVERLAP_COLUMNS = ("exposed us", "GEMM alone us", "GEMM slowdown")


def view_us(r: dict, view: str) -> float | None:
    """A record's time in the `cached` or `kernel` view (rank 0's, as the upstream tests print), else None."""
    v = (r.get("views") or {}).get(view) or {}
    return v.get("mean_us", v.get("us"))


def table_rows(records: list[dict]) -> list[list[str]]:
    with_overlap = any(r.get("overlap") for r in records)
    rows = []
    for r in records:
        t, tr = record.timing(r), record.traffic(r)
        err = record.error(r)
        err = shorten(err, 90)      # the whole error is in the JSONL
        check = record.status(r) + (f" ({err})" if err else "")
        if t and record.is_functional(r):      # CPU/gloo or shared-GPU ranks: the times are no measurement
            check += " [functional only]"
        row = [record.name(r), r["phase"], sig3(t.get("median_us")), sig3(t.get("p90_us")),
               sig3(view_us(r, "cached")), sig3(view_us(r, "kernel")),
               sig3(tr.get("algbw_GBps")), sig3(tr.get("busbw_GBps")), sig3(tr.get("wirebw_GBps")),
               sig3(tr.get("frac_of_ceiling")), check]
        if with_overlap:
            o = r.get("overlap") or {}
            row[-1:-1] = [sig3(o.get("exposed_us")), sig3(o.get("gemm_alone_us")), sig3(o.get("gemm_slowdown"))]
        rows.append(row)
    return rows


TABLE_LEGEND = ("# api/cached/kernel us: the timing views (README, Timing views): the call a training step makes, "
                "the call with its handle reused, the communication kernels alone; algbw: received (token, rank) "
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
