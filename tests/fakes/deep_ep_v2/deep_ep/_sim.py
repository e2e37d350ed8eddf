"""What the fake DeepEP V2 shares: moving tensors over a gloo group and the library's failure forms.

Tensors travel as raw bytes through `all_gather_object` (gloo's object pickling cannot carry float8), as
tests/fakes/deep_ep/sim.py does: slow, and only for small test shapes. EP_HOST_ASSERT throws EPException, which
pybind11 maps to RuntimeError "Assertion exception (<file>:<line>): <cond>" (v2 `deep_ep/include/deep_ep/common/
exception.cuh:11-33`; no custom translator in `csrc/python_api.cpp`).
"""
import os

from gloo_bytes import garbage, gather, u8  # noqa: F401 - the helpers this fake's modules use

CSRC = "/build/DeepEP/csrc"           # __FILE__ of the real build (an absolute path of the build tree)


def ep_assert(ok, file, line, cond):
    if not ok:
        raise RuntimeError(f"Assertion exception ({CSRC}/{file}:{line}): {cond}")


def fake_check(ok, what):
    """A check the real library makes in a way not traced here (or not at all): the fake refuses with ValueError."""
    if not ok:
        raise ValueError(f"fake deep_ep V2: {what}")


def jit_compile(name):
    """FAKE_DEEP_EP_V2_JIT_FAIL=1: the nvcc call of `csrc/jit/compiler.hpp:225-240` fails. The real one prints
    `NVCC compilation failed: <nvcc output>` with printf (stdout) and EP_HOST_ASSERTs; a failed compile is not
    cached, so every call that needs the kernel fails the same way."""
    if os.environ.get("FAKE_DEEP_EP_V2_JIT_FAIL") != "1":
        return
    d = os.path.join(os.environ.get("EP_JIT_CACHE_DIR", os.path.expanduser("~/.deep_ep")), "cache", f"kernel.{name}")
    os.write(1, (f"NVCC compilation failed: {d}/kernel.cu(12): catastrophic error: cannot open source file "
                 f"\"nccl_device.h\"\n  #include <nccl_device.h>\n                          ^\n\n1 catastrophic "
                 f"error detected in the compilation of \"{d}/kernel.cu\".\nCompilation terminated.\n\n").encode())
    ep_assert(False, "jit/compiler.hpp", 239, 'false and "NVCC compilation failed"')
