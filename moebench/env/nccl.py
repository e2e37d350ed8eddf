"""Which libnccl this process loaded (path and version), and whether it is new enough.

NCCL EP (nccl-extensions) and DeepEP V2 call the NCCL that is already mapped in the process: torch maps its own
libnccl.so.2 at import, and both libraries take that one (cuda-pathfinder's first rule is "already loaded";
DeepEP V2's import asserts the mapped file is the one at its NCCL root). So the NCCL a backend ran on can differ
from torch.cuda.nccl.version() only through LD_PRELOAD, and a record names the file and version the process
really loaded. Both need NCCL's device API of 2.30 (ncclCommQueryProperties, GIN fields; DeepEP V2's README
asks >= 2.30.4, Transformer Engine's NCCL EP path checks the same); the H200 image's torch carries 2.28.9.
"""
from __future__ import annotations

import ctypes
import os

NEED = (2, 30, 4)
BUILD_HINT = ("build NCCL 2.30.7 for this GPU (bench/nccl_build.sh) and start the ranks with "
              "LD_PRELOAD=<build>/lib/libnccl.so.2")


def mapped(maps: str = "/proc/self/maps") -> list[str]:
    """Files named libnccl.so* mapped in this process (usually one), in order of first appearance."""
    out: list[str] = []
    try:
        with open(maps) as f:
            for line in f:
                path = line.split(None, 5)[5].strip() if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libnccl.so") and path not in out:
                    out.append(path)
    except (OSError, IndexError):
        pass
    return out


def decode(code: int) -> tuple[int, int, int]:
    """ncclGetVersion's code: X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before."""
    if code >= 20900:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def version_of(path: str) -> tuple[int, int, int] | None:
    """The version a libnccl reports (ncclGetVersion); None when it cannot be asked."""
    try:
        lib = ctypes.CDLL(path)
        v = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(v)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return decode(v.value)


def loaded() -> dict:
    """{"path", "version"} of the libnccl this process has mapped, {"none": why} when it has none."""
    paths = mapped()
    if not paths:
        return {"none": "no libnccl is mapped in this process"}
    v = version_of(paths[0])
    out = {"path": paths[0], "version": ".".join(map(str, v)) if v else None}
    if len(paths) > 1:
        out["also_mapped"] = paths[1:]
    return out


def too_old(found: dict, need: tuple[int, int, int] = NEED, who: str = "this backend") -> str:
    """'' when the loaded libnccl is at least `need`, else one line naming what was found and what is needed."""
    want = ".".join(map(str, need))
    if "none" in found:
        return f"{who} needs libnccl >= {want}: {found['none']}"
    v = found.get("version")
    if v is None:
        return f"{who} needs libnccl >= {want}: cannot read the version of {found['path']}"
    if tuple(int(p) for p in v.split(".")) < need:
        return f"{who} needs libnccl >= {want}; this process loaded {v} from {found['path']}: {BUILD_HINT}"
    return ""
