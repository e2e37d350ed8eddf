"""Which libnccl this process loaded (path and version), and whether it is new enough.

NCCL EP (nccl-extensions) and DeepEP V2 call the NCCL that is already mapped in the process: torch maps a
libnccl.so.2 at import, and both libraries take that one (cuda-pathfinder's first rule is "already loaded";
DeepEP V2's import asserts that one libnccl is mapped and that it is the one at its NCCL root). Which file torch
maps is found on sys.path (`nvidia/nccl/lib/libnccl.so.2`, torch 2.11), so the user's route to a newer NCCL is
the nvidia-nccl wheel in the environment, or a build laid out as nvidia/nccl first on PYTHONPATH; LD_PRELOAD
alone leaves torch's own file mapped beside it (two runtimes: refused here, named with both paths).
`torch.cuda.nccl.version()` is the version torch was built with, whatever it loaded: a record names both
(provenance: `nccl_torch_build`, `nccl_loaded`). Both backends need NCCL's device API of 2.30
(ncclCommQueryProperties, GIN fields; DeepEP V2's README asks >= 2.30.4, Transformer Engine's NCCL EP path
checks the same); the H200 image's torch carries 2.28.9.
"""
from __future__ import annotations

import ctypes
import os

NEED = (2, 30, 4)
INSTALL_HINT = ("make torch itself load NCCL >= 2.30.4: pip install 'nvidia-nccl-cu13>=2.30.4' into this environment, "
                "or put a build's nvidia/nccl layout first on PYTHONPATH (bench/nccl_build.sh prints the line)")


def mapped(maps: str = "/proc/self/maps") -> list[str]:
    """Files named libnccl.so* mapped in this process (usually one), in order of first appearance. A line
    without a path (anonymous memory; some kernels pad those with spaces) names no file."""
    out: list[str] = []
    try:
        with open(maps) as f:
            for line in f:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) > 5 else ""
                if os.path.basename(path).startswith("libnccl.so") and path not in out:
                    out.append(path)
    except OSError:
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
    out = {"path": paths[0], "version": version_text(paths[0], None)}
    if len(paths) > 1:
        out["also_mapped"] = paths[1:]
    return out


def too_old(found: dict, need: tuple[int, int, int] = NEED, who: str = "this backend") -> str:
    """'' when the process maps one libnccl of at least `need`, else one line naming what was found (both files
    where two are mapped: torch calls one, the EP library the other), what is needed and what to do."""
    want = ".".join(map(str, need))
    if "none" in found:
        return f"{who} needs libnccl >= {want}: {found['none']}; {INSTALL_HINT}"
    if found.get("also_mapped"):
        paths = [found["path"], *found["also_mapped"]]
        both = " and ".join(f"{p} ({version_text(p, 'version unknown')})" for p in paths)
        return (f"{who} needs one libnccl in the process, this one maps {1 + len(found['also_mapped'])}: {both} "
                f"(LD_PRELOAD adds one, and torch still loads its own by path); {INSTALL_HINT}")
    v = found.get("version")
    if v is None:
        return f"{who} needs libnccl >= {want}: cannot read the version of {found['path']}"
    if tuple(int(p) for p in v.split(".")) < need:
        return f"{who} needs libnccl >= {want}; this process loaded {v} from {found['path']}: {INSTALL_HINT}"
    return ""


def version_text(path: str, unknown: str | None) -> str | None:
    """'2.30.7' as the libnccl at `path` reports it; `unknown` when it cannot be asked."""
    v = version_of(path)
    return ".".join(map(str, v)) if v else unknown


def versions() -> dict:
    """The NCCL a record names: {"nccl": what ran (the mapped file's version; torch's build version where that
    cannot be read), "nccl_torch_build": torch.cuda.nccl.version(), "nccl_loaded": loaded()}; None for a
    torch without NCCL."""
    import torch
    try:
        build = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a CPU build of torch
        build = None
    found = loaded()
    return {"nccl": found.get("version") or build, "nccl_torch_build": build, "nccl_loaded": found}
