"""How the fake native layer fails, in the forms the real libnccl_ep.so fails (line numbers: nccl-extensions 44d2de0
`nccl_ep/nccl_ep.cc`; the 0.1.0 wheel's library carries the same strings):
  * `return ncclInvalidArgument/...`: the Cython check raises the real `NCCLEpError(status)` ("NCCL EP error code
    N", ext `python/nccl/_extensions/bindings/nccl_ep.pyx:2600-2615`), after the library's own stderr line where it
    prints one (`invalid`);
  * C `assert()` (live in the wheel) aborts the process: `c_assert` raises RuntimeError with glibc's text;
  * EP_HOST_ASSERT throws EPException through the extern "C" API (std::terminate): `host_assert` raises
    RuntimeError with EPException's text (`include/nccl_ep/device/macros.cuh:30-60`);
  * EP_DEVICE_ASSERT traps the kernel (the CUDA context is lost at the next sync): `device_assert`;
  * where the library has no check and would write past a buffer it sized (no error, corrupt memory or an illegal
    address later): `overrun` raises a RuntimeError that says it is the fake's, and what the real one would do.
Checks of things the fake does not simulate raise ValueError (`unsupported`).
"""
import os

from nccl._extensions.bindings.nccl_ep import NCCLEpError

INTERNAL, INVALID_ARGUMENT, INVALID_USAGE = 3, 4, 5
SRC = "nccl_ep/nccl_ep.cc"
DISPATCH, COMBINE = "ncclResult_t ncclEpDispatch(...)", "ncclResult_t ncclEpCombine(...)"     # assert()'s function


def stderr(line: str) -> None:
    os.write(2, (line + "\n").encode())        # the library's fprintf(stderr, ...), at the fd level as native code


def invalid(status: int, line: str | None = None):
    if line:
        stderr(line)
    raise NCCLEpError(status)


def c_assert(ok, line: int, cond: str, func: str = DISPATCH) -> None:
    if not ok:
        raise RuntimeError(f"{SRC}:{line}: {func}: Assertion `{cond}' failed. (the real library aborts: SIGABRT)")


def host_assert(ok, line: int, cond: str) -> None:
    if not ok:
        raise RuntimeError(f"terminate called after throwing an instance of 'EPException'\n  what():  Failed: "
                           f"Assertion error {SRC}:{line} '{cond}' (the real library terminates the process)")


def device_assert(ok, where: str, cond: str) -> None:
    if not ok:
        raise RuntimeError(f"{where}: device-side assertion `{cond}' failed (the real kernel traps: the next CUDA "
                           "call reports an unspecified launch failure)")


def overrun(ok, what: str) -> None:
    if not ok:
        raise RuntimeError(f"fake nccl.ep (simulated, the real library has no check): {what}")


def unsupported(ok, what: str) -> None:
    if not ok:
        raise ValueError(f"fake nccl.ep: {what}")


# ---- the JIT: FAKE_NCCL_EP_JIT_FAIL=1 fails the kernel compile (ext device/jit/ht_dispatch_jit.cuh:245-254,
# ll_dispatch_jit.cuh:130, nvcc_compiler.cc:221-290 for the log form, jit_runtime.cc:886 for the in-process memo)
_failed: set[str] = set()


def jit_launch(kind: str, variant: str) -> None:
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
