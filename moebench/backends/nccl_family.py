"""What the NCCL-based EP backends share (`ncclep` over NCCL EP, `deepep-v2` over DeepEP V2's ElasticBuffer): the
gate on the libnccl the rank loaded, ranks sharing a GPU through NCCL, and the native output of a first call.

Both compile their kernels at run time with nvcc (NCCL EP on the first dispatch of a shape, DeepEP V2 likewise)
and report a failed compile only as a generic error (NCCL EP: "NCCL EP error code 3"; DeepEP V2: "Assertion
exception (compiler.hpp:239)"), with the compiler's own lines written by the native code to stdout or stderr
(DeepEP V2 through C stdio, which buffers when stdout is no terminal), and NCCL EP stops on misuse with a C assert
(SIGABRT). So the setup and the first calls run with the process's fds 1 and 2 going to the rank's native log
(env/native_log.py): C's buffers are flushed before the fds come back, the text is passed on unchanged, a failing
call's error carries its last lines, and a rank that died inside is reported with them by the launcher.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile

from ..env import nccl
from ..env.native_log import NATIVE_LOG_ENV, tail
from .base import Backend, Unavailable

MULTI_RANK_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"
MULTI_RANK_NOTE = (f"{MULTI_RANK_ENV}=1 (NCCL >= 2.30: several ranks on one GPU; experimental, each rank its own "
                   "channels, NVLS off)")
GIN_ENV = "EP_DISABLE_GIN"
GIN_NOTE = (f"{GIN_ENV}=1 (DeepEP V2 without NCCL GIN: NCCL offers no GIN between ranks of one GPU, 'NCCL GIN is "
            "unavailable'; its kernels use the LSA (NVLink/IPC) path alone)")


def require_nccl(who: str) -> dict:
    """The loaded libnccl ({path, version}); Unavailable (the backend is WAIVED) when it is older than NEED."""
    found = nccl.loaded()
    why = nccl.too_old(found, who=who)
    if why:
        raise Unavailable(why)
    return found


def share_gpu(ranks_per_gpu: int, extra: dict[str, str] | None = None) -> list[str]:
    """Shared-GPU ranks: NCCL refuses two ranks on one GPU unless NCCL_MULTI_RANK_GPU_ENABLE=1 is set before
    its communicator is made; `extra` ({VAR: note}) sets a backend's own bypasses too (each to 1). Returns the
    notes a record names as bypasses ([] with one rank per GPU)."""
    if ranks_per_gpu <= 1:
        return []
    bypasses = {MULTI_RANK_ENV: MULTI_RANK_NOTE, **(extra or {})}
    for var in bypasses:
        os.environ[var] = "1"
    return list(bypasses.values())


def flush_c_stdio() -> None:
    """fflush(NULL): what native code printed with C stdio (buffered while stdout is a file) reaches the fd now."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


class NativeFailure(RuntimeError):
    """A native call failed; the message ends with the last lines the library wrote."""


@contextlib.contextmanager
def native_output(what: str):
    """Run the block with fds 1 and 2 going to a file; pass the text on afterwards; on an exception raise
    NativeFailure naming `what`, the error and the library's last lines."""
    for s in (sys.stdout, sys.stderr):
        s.flush()
    flush_c_stdio()
    saved = [os.dup(1), os.dup(2)]
    named = os.environ.get(NATIVE_LOG_ENV)
    with (open(named, "w+b") if named else tempfile.TemporaryFile(mode="w+b")) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        failure = None
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised below with the native lines
            failure = e
        finally:
            for s in (sys.stdout, sys.stderr):
                s.flush()
            flush_c_stdio()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            log.seek(0)
            text = log.read().decode(errors="replace")
            log.truncate(0)                 # passed on below: a later crash must not report it as its own
        if text:
            sys.stderr.write(text)
            sys.stderr.flush()
        if failure is not None:
            raise NativeFailure(f"{what}: {type(failure).__name__}: {failure}{tail(text)}") from failure


class NcclFamily(Backend):
    """The NCCL-based backends' shared steps: the gate on the loaded libnccl and the shared-GPU setting before the
    library is touched (`nccl_setup`), and their first dispatch and combine under native_output (`first_call`)."""
    first = True

    shared_gpu_bypasses: dict[str, str] = {}      # a backend's own {VAR: note} for shared-GPU ranks

    def nccl_setup(self, who: str) -> None:
        self.nccl = require_nccl(who)
        self.bypassed += share_gpu(self.ranks_per_gpu, self.shared_gpu_bypasses)

    def first_call(self, what: str):
        """The kernels are compiled on the first dispatch and combine: their native output is kept for the error."""
        if self.first:
            return native_output(f"{self.name}'s first {what} (its kernels are compiled at run time)")
        return contextlib.nullcontext()
