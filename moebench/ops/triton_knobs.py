"""The Triton kernels' tunables (Knobs), their defaults, and the two ways to set them: a variant string per call
(impl "triton@BH:WARPS:..."), and the environment (MOEBENCH_TRITON_<FIELD>) for the defaults. Pure Python, so
that a tool checks both before any work (ops.env_problem) without importing Triton."""
from __future__ import annotations

import functools
import os
from typing import NamedTuple


class Knobs(NamedTuple):
    """Tunables (per-kernel block sizes). impl "triton@BH:WARPS:UBH:UWARPS:TMA:CS:SB:RW:EB:BB:SW:PDL:CR"
    (a prefix of them; the rest default) picks them per call; env overrides
    (MOEBENCH_TRITON_<FIELD>) set the defaults."""
    copy_bh: int        # words per chunk (permute)
    copy_warps: int
    unperm_bh: int      # elements per chunk (unpermute)
    unperm_warps: int
    # 1: permute's row writes are TMA bulk stores (``_permute_copy_tma``) where the device and the
    # shape allow it (compute capability >= 9, or the interpreter; rows a multiple of 16 bytes);
    # 0 (default): the plain ``_permute_copy``. TMA is opt-in: on Hopper its copy is no faster than
    # the plain one and its descriptor costs host time
    # (docs/decisions.md, "The permute and unpermute defaults").
    copy_tma: int
    # 1 (default): the copy's loads and stores stream (evict-first loads, ".cs" stores), as the CUDA
    # bulk copy's L2 evict-first hints do; 0: plain. Streaming is the default because its copy is
    # slightly faster than the plain one on Hopper
    # (docs/decisions.md, "The permute and unpermute defaults").
    copy_cs: int
    # the index kernels: ``_route_rank``'s fewest slots per block (a power of 2; more when there are
    # more than 128 blocks' worth) and warps; ``_route_scan``'s experts per program, blocks per
    # chunk and warps. Each default is the fastest of the settings tried at T 4096, K 8, E 256
    # (docs/decisions.md, "The permute and unpermute defaults").
    rank_sb: int
    rank_warps: int
    scan_eb: int
    scan_bb: int
    scan_warps: int
    # 1 (default): the scan and the copy are programmatic dependent launches where the device has
    # them (compute capability >= 9; not the interpreter), see triton_kernels.py; 0: plain launches.
    # On by default: hiding the launch latency between the kernels makes the permute slightly faster
    # (docs/decisions.md, "The permute and unpermute defaults").
    pdl: int
    # tokens per copy program (a power of 2, 1-64): > 1 runs ``_permute_copy_rows``, whose program
    # loads a [copy_rows, copy_bh] tile of rows at once and stores it K times, the CUDA rows kernel's
    # structure (several whole rows in flight per SM). 1 (default): the plain one-token programs,
    # until the GPU says which is faster (no TMA form: refused with copy_tma 1).
    copy_rows: int


BUILT_IN = Knobs(copy_bh=1024, copy_warps=4, unperm_bh=1024, unperm_warps=4, copy_tma=0, copy_cs=1, rank_sb=256,
                 rank_warps=4, scan_eb=16, scan_bb=128, scan_warps=4, pdl=1, copy_rows=1)
SWITCHES = ("copy_tma", "copy_cs", "pdl")                                    # 0 or 1
POWERS_OF_2 = ("rank_sb", "scan_eb", "scan_bb", "copy_rows")
WARPS = ("copy_warps", "unperm_warps", "rank_warps", "scan_warps")           # Triton's num_warps: 1, 2, 4, ... 32


def check(k: Knobs, label: str) -> Knobs:
    """k, or ValueError ("LABEL: why") for a value no kernel takes."""
    for f in Knobs._fields:
        if getattr(k, f) < 0:
            raise ValueError(f"{label}: {f} must be >= 0, not {getattr(k, f)}")
    for f in SWITCHES:
        if getattr(k, f) not in (0, 1):
            raise ValueError(f"{label}: {f} must be 0 or 1, not {getattr(k, f)}")
    for f in POWERS_OF_2:
        v = getattr(k, f)
        if v < 1 or v & (v - 1):
            raise ValueError(f"{label}: {f} must be a power of 2, not {v}")
    for f in WARPS:
        v = getattr(k, f)
        if v < 1 or v & (v - 1) or v > 32:
            raise ValueError(f"{label}: {f} (warps) must be a power of 2 up to 32, not {v}")
    if k.copy_rows > 64:
        raise ValueError(f"{label}: copy_rows must be at most 64, not {k.copy_rows}")
    if k.copy_rows > 1 and k.copy_tma:
        raise ValueError(f"{label}: copy_rows {k.copy_rows} has no TMA form (copy_tma must be 0)")
    return k


def env_knobs(environ=None) -> Knobs:
    """The defaults: BUILT_IN with MOEBENCH_TRITON_<FIELD> applied; ValueError naming the variable when one
    holds no integer, or the knobs it makes are no valid set."""
    e = os.environ if environ is None else environ
    k = BUILT_IN
    for f in Knobs._fields:
        name = f"MOEBENCH_TRITON_{f.upper()}"
        if name in e:
            try:
                k = k._replace(**{f: int(e[name])})
            except ValueError:
                raise ValueError(f"{name}={e[name]!r}: must be an integer") from None
    set_here = " ".join(f"MOEBENCH_TRITON_{f.upper()}={e[f'MOEBENCH_TRITON_{f.upper()}']}" for f in Knobs._fields
                        if f"MOEBENCH_TRITON_{f.upper()}" in e)
    return check(k, set_here or "the built-in defaults")


try:
    DEFAULT_KNOBS = env_knobs()
except ValueError:                  # a tool refuses it before any work (ops.env_problem); a library caller gets
    DEFAULT_KNOBS = BUILT_IN        # the built-in defaults


def knobs(variant: str = "") -> Knobs:
    """The Knobs of a variant string "BH:WARPS:UBH:UWARPS:TMA:CS:SB:RW:EB:BB:SW:PDL:CR" ('' or a
    prefix: the rest default)."""
    return _parse_knobs(variant) if variant else DEFAULT_KNOBS


@functools.lru_cache(maxsize=64)
def _parse_knobs(variant: str) -> Knobs:
    try:
        vals = [int(v) for v in variant.split(":")]
    except ValueError:
        raise ValueError(f"triton@{variant}: want integers separated by colons ({':'.join(Knobs._fields)})") from None
    if len(vals) > len(Knobs._fields):
        raise ValueError(f"triton@{variant}: at most {len(Knobs._fields)} values ({':'.join(Knobs._fields)})")
    return check(DEFAULT_KNOBS._replace(**dict(zip(Knobs._fields, vals))), f"triton@{variant}")
