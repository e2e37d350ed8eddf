"""The DeepEP build installed here, read from its files and package metadata without importing it
(a crashing build is imported only in contained child processes): the install hint, the message a
build without NVSHMEM gives, and its version for the records.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from .toolkit import dist_version

HINT = ("install DeepEP from branch hybrid-ep (legacy Buffer + HybridEPBuffer) or tag v1.2.1; DeepEP main "
        "(2.x) also serves deepep and deepep-ll (its deep_ep.Buffer is the legacy API, same signature) but has "
        "no HybridEPBuffer, and its deep_ep.utils lacks the EventOverlap that Megatron-Core's fused_a2a imports, "
        "so Megatron's flex/deepep path (mcore-deepep) finds no DeepEP there")
NO_NVSHMEM = "NVSHMEM is disable"   # DeepEP says "disabled" in deep_ep.cpp, "disable" in config.hpp


def build_version() -> str:
    """deep_ep's version for the record: the installed distribution's, else, for a source build
    (setup.py build_ext --inplace, as bench/deepep_build.sh makes), the deepep_build.json beside
    the package: version, commit and build kind."""
    v = dist_version("deep_ep", "deep-ep")
    if v:
        return v
    try:
        spec = importlib.util.find_spec("deep_ep")
        meta = Path(spec.origin).parent.parent / "deepep_build.json"
        b = json.loads(meta.read_text())
    except (ImportError, ValueError, AttributeError, TypeError, OSError):
        return ""
    fix = f", fix {b['fix']}" if b.get("fix") not in (None, "none") else ""
    return f"{b.get('version', '?')} {b.get('branch', '')}@{str(b.get('commit', ''))[:10]} ({b.get('build_kind', '?')}{fix})"


def rdma_size_problem(ranks: int = 2, hidden_bytes: int = 2 * 1024) -> str | None:
    """Why Megatron's fused_a2a cannot size its DeepEP buffer with this build, else None.
    fused_a2a.get_buffer asks get_rdma_buffer_size_hint even within one node, and a DeepEP built
    without NVSHMEM asserts there (csrc/config.hpp), so Megatron's flex/deepep path dies on its
    first dispatch. Host-only: needs no GPU."""
    from deep_ep import Buffer
    try:
        Buffer.get_dispatch_config(ranks).get_rdma_buffer_size_hint(hidden_bytes, ranks)
    except RuntimeError as e:
        if NO_NVSHMEM in str(e):
            return ("this DeepEP was built without NVSHMEM, and megatron-core's fused_a2a asks it for an RDMA "
                    "buffer size (get_rdma_buffer_size_hint) even within a node, which it refuses: Megatron's "
                    "flex/deepep path fails on its first dispatch; rebuild DeepEP with NVSHMEM")
        raise
    return None
