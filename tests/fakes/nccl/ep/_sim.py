"""What the fake nccl.ep shares: moving tensors over a gloo group, the library's failure forms, the JIT failure.

Tensors travel as raw bytes through `all_gather_object` (gloo's object pickling cannot carry float8), as
tests/fakes/deep_ep/sim.py does: slow, and only for small test shapes. Failure forms of the real library:
  * `return ncclInvalidArgument/...` -> the Cython check raises NCCLEpError(status) (`invalid`), after the
    library's own stderr line where it prints one;
  * C `assert()` (live in the wheel) aborts the process: `c_assert` raises RuntimeError with glibc's text;
  * EP_HOST_ASSERT throws EPException through the extern "C" API (std::terminate): `host_assert` raises
    RuntimeError with EPException's text (`include/nccl_ep/device/macros.cuh:30-60`).
"""
import os

from gloo_bytes import garbage, gather, u8  # noqa: F401 - the helpers this fake's modules use
from nccl._extensions.bindings.nccl_ep import NCCLEpError

INTERNAL, INVALID_ARGUMENT, INVALID_USAGE = 3, 4, 5
SRC = "nccl_ep/nccl_ep.cc"          # line numbers: ext 44d2de0 (the wheel's may differ; its strings are the same)


def stderr(line):
    os.write(2, (line + "\n").encode())        # the library's fprintf(stderr, ...), at the fd level as native code


def invalid(status, line=None):
    if line:
        stderr(line)
    raise NCCLEpError(status)


def c_assert(ok, line, cond, func="ncclResult_t ncclEpDispatch(...)"):
    if not ok:
        raise RuntimeError(f"{SRC}:{line}: {func}: Assertion `{cond}' failed. (the real library aborts: SIGABRT)")


def host_assert(ok, line, cond):
    if not ok:
        raise RuntimeError(f"terminate called after throwing an instance of 'EPException'\n  what():  Failed: "
                           f"Assertion error {SRC}:{line} '{cond}' (the real library terminates the process)")


def fake_check(ok, what):
    """A check the real library makes in a way not traced here (or not at all): the fake refuses with ValueError."""
    if not ok:
        raise ValueError(f"fake nccl.ep: {what}")


# ---- the JIT: FAKE_NCCL_EP_JIT_FAIL=1 fails the kernel compile (ext device/jit/ht_dispatch_jit.cuh:245-254,
# ll_dispatch_jit.cuh:130, nvcc_compiler.cc:221-290 for the log form, jit_runtime.cc:886 for the in-process memo)
_failed = set()


def jit_launch(kind, variant):
    if os.environ.get("FAKE_NCCL_EP_JIT_FAIL") != "1":
        return
    d = os.environ.get("NCCL_EP_JIT_CACHE_DIR", "/tmp/nccl_ep/jit") + "/" + variant
    log = "" if variant in _failed else (
        f": $ /usr/local/cuda/bin/nvcc --cubin {d}/kernel.cu -o {d}/kernel.cubin --std=c++17 -arch=sm_90\n"
        f"{d}/kernel.cu(7): catastrophic error: cannot open source file \"nccl_device.h\"\n"
        f"  #include <nccl_device.h>\n                          ^\n\n"
        f"1 catastrophic error detected in the compilation of \"{d}/kernel.cu\".\nCompilation terminated.\n"
        f"exit_code=1\nnvcc_process_sec=0.41\n")
    _failed.add(variant)                     # later launches: the cache's failure memo, no log
    stderr(f"[nccl_ep jit] fatal {kind} JIT launch failure for {variant}: compile failed{log}")
    raise NCCLEpError(INTERNAL)
