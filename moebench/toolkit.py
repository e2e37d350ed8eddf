"""Where the CUDA toolkit is: one lookup for everything that compiles (the ops JIT build, the
p2p probe, HybridEP's kernel JIT and the checks that report on it)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

DEFAULT_HOMES = ("/usr/local/cuda",)  # where torch's cpp_extension also looks last


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
