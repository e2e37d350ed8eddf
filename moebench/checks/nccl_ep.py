"""The NCCL-based dispatchers' acceptance: NCCL EP (`ncclep`, both modes) and DeepEP V2 (`deepep-v2`) round trips
against the oracle, run as checks/ep.py runs DeepEP's (the dispatch path in a child: a crash or hang is FAIL with
its signal). WAIVED with the reason where the library is missing (its install line), is the wrong DeepEP (V1), or
the rank loaded an NCCL older than both need (the version found and the one needed); FAIL with the library's last
lines where its run-time kernel compile fails (backends/nccl_family.py keeps them).
"""
from __future__ import annotations

from ..backends import base
from .ep import roundtrip
from .registry import Context, register, waived


def _gate(backend: str, ctx: Context, variants: list[dict]):
    ok, why = base.get(backend).available()
    if not ok:
        return waived(f"{backend}: {why}")
    return roundtrip(ctx, backend, variants)


@register("ncclep.roundtrip", "ncclep (NCCL EP, high-throughput and low-latency) dispatch + combine against the "
          "oracle: one rank per GPU on 2+ GPUs, else 2 ranks sharing one GPU (NCCL_MULTI_RANK_GPU_ENABLE)")
def check_ncclep_roundtrip(ctx: Context):
    return _gate("ncclep", ctx, [{"mode": "ht"}, {"mode": "ll"}])


@register("deepep-v2.roundtrip", "deepep-v2 (DeepEP V2 ElasticBuffer) dispatch + combine against the oracle: one "
          "rank per GPU on 2+ GPUs, else 2 ranks sharing one GPU (NCCL_MULTI_RANK_GPU_ENABLE)")
def check_deepep_v2_roundtrip(ctx: Context):
    return _gate("deepep-v2", ctx, [{}])
