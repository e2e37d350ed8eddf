"""NCCL EP enums with the wheel's names and values (whl `nccl/ep/enums.py`, mirroring `ep_enums.h` / `nccl_ep.h`)."""
from enum import IntEnum

__all__ = ["Algorithm", "CombineQuantizationRecipe", "DispatchQuantizationRecipe", "ExpertIdKind", "Layout",
           "OverflowPolicy", "PassDir", "ZeroCopyMode"]


class Algorithm(IntEnum):
    LOW_LATENCY = 0
    HIGH_THROUGHPUT = 1


class Layout(IntEnum):
    """UNSET trips an assertion at handle init; LL: EXPERT_MAJOR / RANK_MAJOR; HT: EXPERT_MAJOR / FLAT."""
    UNSET = 0
    EXPERT_MAJOR = 1
    RANK_MAJOR = 2
    FLAT = 3


class PassDir(IntEnum):
    FWD = 0
    BWD = 1


class OverflowPolicy(IntEnum):
    AUTO = 0          # resolves to TRAP
    TRAP = 1
    DROP = 2


class ZeroCopyMode(IntEnum):
    AUTO = 0
    OFF = 1
    ON = 2


class ExpertIdKind(IntEnum):
    AUTO = 0          # resolves to LOCAL
    LOCAL = 1
    GLOBAL = 2


class DispatchQuantizationRecipe(IntEnum):
    NONE = 0
    FWD = 1           # forward the caller's tokens and scales byte for byte (HT and LL)
    DS_FP8E3M4 = 2    # LL only: bf16 in, e4m3 + fp32 scales per 128 out


class CombineQuantizationRecipe(IntEnum):
    NONE = 0
    NVFP4 = 1         # LL only, experimental
