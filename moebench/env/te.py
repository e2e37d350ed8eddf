"""Transformer Engine as megatron-core 0.19's ncclep path needs it, read from its files (importing TE here would be
slow and may crash): the version that path calls, its pytorch/ep.py, and an extension built with NCCL EP."""
from __future__ import annotations

import importlib.util
import os

from .buildkind import contains, extension_path
from .toolkit import dist_version

TE_FOR_NCCLEP = "2.18"      # the Transformer Engine line megatron-core 0.19's ncclep path calls (flags.py says why)
TE_EP_BINDING = b"ep_initialize"     # a function transformer_engine_torch registers only when built with NCCL EP


def te_nccl_ep_problem() -> str:
    """'' when Transformer Engine can serve megatron-core 0.19's ncclep: version 2.18, its pytorch/ep.py, and its
    extension built with NCCL EP (NVTE_WITH_NCCL_EP: transformer_engine_torch registers ep_initialize; ep.py exists
    without it). Else why not, in one line. Read from the files: importing TE here would be slow and may crash."""
    try:
        spec = importlib.util.find_spec("transformer_engine")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "transformer_engine is not installed"
    roots = list(spec.submodule_search_locations or [])
    if not any(os.path.isfile(os.path.join(r, "pytorch", "ep.py")) for r in roots):
        return "transformer_engine has no pytorch/ep.py (TE before 2.17 has no NCCL EP module)"
    version = dist_version("transformer_engine", "transformer-engine", "transformer_engine_torch") or "unknown"
    if not version.startswith(TE_FOR_NCCLEP + "."):
        return f"transformer_engine is {version}; megatron-core 0.19's ncclep path calls TE {TE_FOR_NCCLEP} exactly"
    so = extension_path("transformer_engine_torch")
    try:
        built = bool(so) and bool(contains(so, (TE_EP_BINDING,)))
    except OSError:
        built = False
    if not built:
        return (f"transformer_engine {version} was built without NCCL EP (its transformer_engine_torch "
                f"{'at ' + so + ' ' if so else ''}has no ep_initialize: rebuild with NVTE_WITH_NCCL_EP=1)")
    return ""
