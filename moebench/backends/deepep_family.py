"""What the DeepEP family shares: `deepep`, `deepep-ll`, `hybridep` and Megatron's flex path (mcore-deepep,
mcore-hybridep, megatron validate) all import DeepEP through here: finding and importing deep_ep, its
buffer's construction and teardown, the shared-GPU NVLink bypass, grouping received rows by local expert,
the SM knob, the receive room of the memory estimate, HybridEP's kernel JIT toolkit, and preparing
Megatron's deep_ep.Buffer.

Legend: T tokens, H hidden, K top-k, L local experts, N received tokens, R grouped rows.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import ops
from ..env.deepep import HINT, NO_NVSHMEM
from ..env.toolkit import find_nvcc
from .base import Knob, Unavailable

FP8_FACTOR = (1 + 4 / 128) / 2      # DeepEP's and HybridEP's tests: fp8 bytes = bf16 bytes x this
NUM_SMS = Knob(low=2, even=True)    # Buffer.set_num_sms takes an even count

NVLINK_BYPASS = ("check_nvlink_connections in deep_ep.Buffer's module (NVML has no NVLink P2P status "
                 "of a GPU with itself)")


def find(module: str) -> tuple[bool, str]:
    """find_spec only (never imports): (False, why) when the package is absent."""
    try:
        ok = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as e:
        return False, f"{module}: {e}"
    return (True, "") if ok else (False, f"{module} not installed; {HINT}")


def import_deep_ep(attr: str):
    """deep_ep and deep_ep.<attr>; Unavailable with the exact error and a hint otherwise."""
    try:
        import deep_ep
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot serve this run"
        raise Unavailable(f"import deep_ep failed: {type(e).__name__}: {e}; {HINT}") from e
    if not hasattr(deep_ep, attr):
        raise Unavailable(f"deep_ep {getattr(deep_ep, '__version__', '?')} has no deep_ep.{attr}; {HINT}")
    return deep_ep, getattr(deep_ep, attr)


def bypass_nvlink_check() -> str:
    """Shared-GPU ranks only: Buffer.__init__ asks NVML whether every pair of ranks' GPUs is
    NVLink-connected, which NVML cannot answer for a GPU and itself. Buffer calls the name it
    imported into its own module (deep_ep.buffer on hybrid-ep and v1.2.1, deep_ep.buffers.legacy on
    main), so that is the one replaced (Megatron's Buffer too)."""
    from deep_ep import Buffer
    sys.modules[Buffer.__module__].check_nvlink_connections = lambda *args, **kwargs: None
    return NVLINK_BYPASS


def new_buffer(Buffer, *args, **kwargs):
    """Buffer(...) with explicitly_destroy where this DeepEP has it (its destructor can hang
    during exception handling); a build without NVSHMEM cannot serve RDMA or low-latency mode."""
    if "explicitly_destroy" in inspect.signature(Buffer.__init__).parameters:
        kwargs["explicitly_destroy"] = True
    try:
        return Buffer(*args, **kwargs)
    except RuntimeError as e:
        if NO_NVSHMEM in str(e):
            raise Unavailable(f"this deep_ep was built without NVSHMEM ({NO_NVSHMEM}): no low-latency "
                              "or cross-node mode") from e
        raise


def destroy(buffer) -> None:
    if buffer is not None and getattr(buffer, "explicitly_destroy", False):
        buffer.destroy()


@dataclass
class Grouped:
    x_RH: torch.Tensor
    scales_RS: torch.Tensor | None
    row_map_NK: torch.Tensor       # int32: grouped row of received slot (n, k), -1 elsewhere
    probs_R: torch.Tensor          # fp32: the received top-k weight of each grouped row (what the experts apply)
    tokens_per_expert: torch.Tensor


def group_by_local_expert(x_NH, local_idx_NK, weights_NK, num_local: int, scales_NS=None,
                          num_rows: int | None = None, impl: str = "auto") -> Grouped:
    """Received tokens (one row per token) -> rows grouped by local expert, stable by token, each with its received
    weight (Megatron's `dispatch_postprocess` permute with probs). local_idx_NK holds local expert ids in [0, L) or
    -1 (whose weights are never read); num_rows, when the backend already knows the count, spares the device->host wait."""
    p = ops.permute(x_NH, local_idx_NK, num_local, scales_TS=scales_NS, impl=impl, num_out_rows=num_rows,
                    probs_TK=weights_NK)               # the permute reads only the slots of local experts
    return Grouped(p.x_RH, p.scales_RS, p.row_map_TK, p.probs_R, p.tokens_per_expert)


def unpermuted_rows(y_RH, g: Grouped, impl: str = "auto") -> torch.Tensor:
    """Per received token: the sum of its local experts' output rows ([N, H], y's dtype), unweighted (the experts
    applied the probs): Megatron's `combine_preprocess` unpermute, what DeepEP's / HybridEP's combine is given."""
    return ops.unpermute(y_RH[: g.x_RH.shape[0]], g.row_map_NK, None, impl=impl)


def recv_room_bytes(w) -> int:
    """Receive room for every rank's tokens, EP x T x (payload + bf16 combine rows): an assumption for the memory
    estimate of the deduplicating backends (DeepEP normal, HybridEP), not their own size rule."""
    return w.ep * w.num_tokens * (w.bytes_per_token + 2 * w.hidden)


def cuda_home() -> str:
    """$CUDA_HOME with bin/nvcc; when unset, derived from find_nvcc() (and exported for the JIT)."""
    home = os.environ.get("CUDA_HOME")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return home
    nvcc = find_nvcc()
    if home or not nvcc:
        raise Unavailable(f"HybridEP JIT-compiles kernels with $CUDA_HOME/bin/nvcc, but CUDA_HOME is "
                          f"{repr(home) + ' without bin/nvcc' if home else 'unset and no nvcc was found'}; "
                          "export CUDA_HOME=<CUDA toolkit root>")
    os.environ["CUDA_HOME"] = str(Path(nvcc).resolve().parent.parent)
    return os.environ["CUDA_HOME"]


def deepep_flex_setup(world: int, hidden: int, ranks_per_gpu: int) -> list[str]:
    """Before Megatron builds its deep_ep.Buffer (mcore-deepep, megatron/quick/train.py, megatron validate's ranks):
    Unavailable with the reason for a DeepEP build Megatron cannot size a buffer with; with ranks sharing a GPU, DeepEP's NVML
    NVLink check (which cannot answer for a GPU and itself) is bypassed. Returns what was bypassed."""
    from ..env.deepep import rdma_size_problem
    problem = rdma_size_problem(world, hidden * 2)
    if problem:
        raise Unavailable(problem)
    return [bypass_nvlink_check()] if ranks_per_gpu > 1 else []
