"""What is installed here: the CUDA toolkit (one nvcc lookup for everything that compiles: the ops
JIT build, the p2p probe, HybridEP's kernel JIT and the checks that report on it), Python packages
(found or versioned without importing them), and moebench's own data files (CUDA sources, sweeps),
which ship inside the package so that a wheel install finds them."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from pathlib import Path

DEFAULT_HOMES = ("/usr/local/cuda",)  # where torch's cpp_extension also looks last
PACKAGE_DIR = Path(__file__).resolve().parents[1]   # the moebench package, installed or a checkout's
CSRC_DIR = PACKAGE_DIR / "csrc"                      # CUDA sources: the ops' JIT build, the probes
SWEEPS_DIR = PACKAGE_DIR / "sweeps"                  # named sweeps (--sweep NAME)


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, then /usr/local/cuda/bin; None if absent."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    for home in DEFAULT_HOMES:
        if (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return None


def installed(module: str) -> bool:
    """Whether `module` can be found, without importing it (a dotted name imports its parents)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def package_file(module: str, relpath: str) -> Path | None:
    """The file `relpath` inside package `module` (found, not imported: a dotted name imports its parents), or None
    where the package or the file is absent."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / relpath).is_file():
            return Path(root) / relpath
    return None


def dist_version(*names: str) -> str | None:
    """Version of the first installed distribution among `names` (spellings of one package); None if none."""
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
