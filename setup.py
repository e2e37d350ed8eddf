"""Optional CUDA extension ``moebench._C`` (metadata lives in pyproject.toml).

Built when torch has CUDA and nvcc is found; ``MOEBENCH_BUILD_EXT=0`` skips it. Without it, the
first GPU use JIT-builds the same sources into a cache (moebench/ops/cuda_impl.py), or the ops
fall back to Triton and ``moebench.ops.impl_status()`` says why.
Arch list: $TORCH_CUDA_ARCH_LIST if set, else "9.0a" (Hopper, the benchmark target).
"""
import os
import shutil

from setuptools import setup


def _ext_modules():
    if os.environ.get("MOEBENCH_BUILD_EXT", "1") == "0":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except Exception as e:  # torch missing at build time: pure-Python install
        print(f"moebench: not building moebench._C ({e})")
        return [], {}
    nvcc = shutil.which("nvcc") or (CUDA_HOME and os.path.join(CUDA_HOME, "bin", "nvcc"))
    if torch.version.cuda is None or not nvcc or not os.path.exists(nvcc):
        print("moebench: not building moebench._C (torch without CUDA or no nvcc); "
              "GPU runs will JIT-build it or fall back to Triton")
        return [], {}
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    ext = CUDAExtension(
        "moebench._C", ["moebench/csrc/moe_permute.cu", "moebench/csrc/bindings.cpp"], include_dirs=["moebench/csrc"],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "-std=c++17"]})
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = _ext_modules()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
