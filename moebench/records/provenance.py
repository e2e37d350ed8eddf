"""Provenance of a run: versions, hardware, git sha and the repro command every record carries."""
from __future__ import annotations

import datetime
import functools
import os
import platform
import socket
import subprocess
import sys

from ..env import nccl
from ..env.deepep import build_info, build_version
from ..env.toolkit import PACKAGE_DIR, dist_version

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
    root = PACKAGE_DIR.parent
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
        "deep_ep": build_version() or None, "deep_ep_build": build_info(),
        "megatron_core": dist_version("megatron-core", "megatron_core"),
        "transformer_engine": dist_version("transformer_engine", "transformer-engine"),
        "hostname": socket.gethostname(), "driver": None, "gpu": None, "gpu_count": 0, "cc": None,
        "env": {k: v for k, v in sorted(os.environ.items()) if k in ENV_ALLOWLIST or k.startswith("NVSHMEM_")},
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_count=torch.cuda.device_count(), cc=f"{p.major}.{p.minor}",
                   sms=p.multi_processor_count)
        env.update(nccl.versions())      # what ran (the mapped libnccl) beside torch's build-time version
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    from ..env.topology import nvml
    try:
        v = nvml().nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def repro_command(argv: list[str] | None, module: str) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join([f"python -m {module}", *args])
