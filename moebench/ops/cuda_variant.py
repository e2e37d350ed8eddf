"""The CUDA permute's variant strings and the shared-memory rule of its rows kernel, in pure Python.

impl ``cuda@V`` or ``cuda@V:C`` (moebench.ops): V is the kernel's variant bits
(csrc/moe_permute.h), C the rows kernel's rows per CTA (1-16; absent or 0: auto, as many rows as
112 KB hold, the standalone probe's best: 8 rows of 14 KB, 2 CTAs per SM). The default copy is the
rows kernel (csrc/permute_rows.cuh) after the separate index kernels (16384): on the H200 it beat the
rows kernel with the index work fused in behind a grid barrier (variant 0) on all four benchmark shapes,
140 vs 147 us at T 4096, H 7168 (bench/results/permute-README.md).

Why here, apart from cuda_impl: a variant is refused with its reason when the impl string is
parsed (``parse``), on any machine, before anything launches; whether C rows of a given shape fit
a device's shared memory is a rule over numbers (``rows_problem``), which cuda_impl applies per
call, falling back to the default variant with a warning rather than failing a launch. The C side
checks the same again (csrc/permute_rows.cuh: rows_applicable, launch_rows) and falls back to the
bulk or warp copy, so a disagreement costs speed, never a result.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

NO_HINTS = 1            # no L2 evict-first hints (rows and bulk kernels); warp copy: streaming
WARP = 16               # per-warp register copy
GATHER = 256            # destination-order gather (csrc/permute_gather.cuh)
BULK = 8192             # one-row bulk kernel, the previous default
UNFUSED = 16384         # rows kernel after the separate index kernels (route_rank + route_scan)
PDL = 32768             # with UNFUSED: route_scan and the rows kernel as programmatic dependent launches
ONE_INDEX = 4096        # with UNFUSED: route_rank and route_scan in one launch (its last block scans)
OTHER_COPY = WARP | GATHER | BULK
ROWS_SHIFT = 16         # C travels in variant bits 16-20
ROWS_MAX = 16           # csrc kRowsMaxC
ROWS_AUTO_BYTES = 112 * 1024   # csrc kRowsAutoBytes
LANE_SLOTS = 32 * 16    # csrc: C*K slots per group, 16 per lane
FUSED_MAX_E = 1024      # csrc kFusedMaxE: the fused kernel's histogram is E int32 in shared memory
STATIC_SMEM = 128       # the kernel's static shared memory (its mbarrier, 128-byte aligned; ptxas -v)
HOPPER_SMEM_OPTIN = 232448     # cudaDevAttrMaxSharedMemoryPerBlockOptin on H100 / H200 (227 KB)


class CudaVariant(NamedTuple):
    bits: int           # variant bits 0-15 (csrc/moe_permute.h)
    rows: int = 0       # rows per CTA of the rows kernel; 0 = auto

    @property
    def code(self) -> int:
        """The int moe_permute takes."""
        return self.bits | (self.rows << ROWS_SHIFT)

    @property
    def rows_kernel(self) -> bool:
        """The rows kernel is this variant's copy (where the shape allows it)."""
        return not self.bits & OTHER_COPY


# bf16: the rows kernel after the index work in one launch, both as programmatic dependent launches: 0.953 /
# 0.947 / 0.917 / 0.950 of copy on the four issue shapes against 0.921 / 0.935 / 0.882 / 0.924 after the two index
# kernels in plain launches (bench/results/permute-h100.jsonl, one H100 run)
DEFAULT = CudaVariant(UNFUSED | ONE_INDEX | PDL)
# fp8 rows with their scales: the one-row bulk kernel, 0.836 / 0.839 of copy at T 4096 / 16384 against 0.760 /
# 0.796 for the rows kernel after the index kernels and 0.789 / 0.802 for the bf16 default (permute-h100-fp8.jsonl)
FP8_DEFAULT = str(BULK)


@functools.lru_cache(maxsize=128)
def parse(variant: str) -> CudaVariant:
    """CudaVariant of "V" or "V:C" ('' = the default); ValueError with the reason otherwise."""
    if not variant:
        return DEFAULT
    fields = variant.split(":")
    if len(fields) > 2:
        raise ValueError(f"cuda@{variant}: want V or V:C (variant bits, rows per CTA), got {len(fields)} fields")
    try:
        bits, rows = int(fields[0]), int(fields[1]) if len(fields) == 2 else 0
    except ValueError:
        raise ValueError(f"cuda@{variant}: V and C must be integers") from None
    if not 0 <= bits < 1 << ROWS_SHIFT:
        raise ValueError(f"cuda@{variant}: variant bits must be in [0, {1 << ROWS_SHIFT}); "
                         "rows per CTA go after a colon (cuda@V:C)")
    if not 0 <= rows <= ROWS_MAX:
        raise ValueError(f"cuda@{variant}: rows per CTA must be 1-{ROWS_MAX} (0 = auto), not {rows}")
    if rows and not CudaVariant(bits).rows_kernel:
        raise ValueError(f"cuda@{variant}: rows per CTA apply to the rows kernel; bits {bits & OTHER_COPY} "
                         "pick another copy (16 warp, 256 gather, 8192 bulk)")
    return CudaVariant(bits, rows)


def auto_rows(row_bytes: int) -> int:
    """The rows kernel's C when the variant leaves it at 0 (csrc rows_per_cta)."""
    return max(1, min(ROWS_MAX, ROWS_AUTO_BYTES // max(row_bytes, 1)))


def rows_smem_bytes(rows: int, row_bytes: int, num_experts: int) -> int:
    """Shared memory per CTA of the rows kernel: C rows, or (fused, E <= FUSED_MAX_E) the expert
    histogram if that is larger, rounded to 16 bytes, plus the static part."""
    hist = 4 * num_experts if num_experts <= FUSED_MAX_E else 0
    return -(-max(rows * row_bytes, hist) // 16) * 16 + STATIC_SMEM


def rows_problem(rows: int, row_bytes: int, topk: int, num_experts: int,
                 smem_optin: int = HOPPER_SMEM_OPTIN) -> str:
    """Why the rows kernel cannot take C = rows (0: auto) rows of row_bytes with top-k topk on a
    device with smem_optin bytes of shared memory per block; '' when it can."""
    if not 1 <= topk <= 32:
        return f"top-k {topk} outside 1-32"
    if row_bytes <= 0 or row_bytes % 16:
        return f"rows of {row_bytes} bytes are not a multiple of 16 (bulk copies move 16-byte units)"
    c = rows or auto_rows(row_bytes)
    if c * topk > LANE_SLOTS:
        return f"{c} rows x top-k {topk} = {c * topk} slots per group, more than {LANE_SLOTS}"
    need = rows_smem_bytes(c, row_bytes, num_experts)
    if need > smem_optin:
        return (f"{c} rows of {row_bytes} bytes need {need} bytes of shared memory per CTA; the device "
                f"allows {smem_optin}")
    return ""


def check(variant: str, *, row_bytes: int | None = None, topk: int | None = None,
          num_experts: int = 0, smem_optin: int = HOPPER_SMEM_OPTIN) -> CudaVariant:
    """parse(variant), and, given a row size and top-k, refuse an explicit C that the rows kernel
    cannot take at that shape (a tool that knows its shapes when it parses its impl strings)."""
    v = parse(variant)
    if v.rows and row_bytes is not None and topk is not None:
        why = rows_problem(v.rows, row_bytes, topk, num_experts, smem_optin)
        if why:
            raise ValueError(f"cuda@{variant}: {why}")
    return v


ENV = ("MOEBENCH_CUDA_PERMUTE_VARIANT", "MOEBENCH_CUDA_UNPERMUTE_VARIANT")       # the defaults' variants


def env_problem(environ=None) -> str:
    """'' or one line naming the variable of ENV that holds no variant ("V" or "V:C")."""
    e = os.environ if environ is None else environ
    for name in ENV:
        if name in e:
            try:
                parse(e[name])
            except ValueError as err:
                return f"{name}={e[name]!r}: {str(err).partition(': ')[2]}"
    return ""
