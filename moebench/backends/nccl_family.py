"""What the NCCL-based EP backends share (`ncclep` over NCCL EP, `deepep-v2` over DeepEP V2's ElasticBuffer): the
gate on the libnccl the rank loaded, ranks sharing a GPU through NCCL, and the native output of a first call.

Both compile their kernels at run time with nvcc (NCCL EP on the first dispatch of a shape, DeepEP V2 likewise)
and report a failed compile only as a generic error (NCCL EP: "NCCL EP error code 3"; DeepEP V2: "Assertion
exception (compiler.hpp:239)"), with the compiler's own lines written by the native code to stdout or stderr. So a
first call runs with the process's fds 1 and 2 captured: the text is passed on unchanged, and a failing call's
error carries its last lines, which is what names the cause.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from ..env import nccl
from .base import Backend, Unavailable

MULTI_RANK_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"
MULTI_RANK_NOTE = (f"{MULTI_RANK_ENV}=1 (NCCL >= 2.30: several ranks on one GPU; experimental, each rank its own "
                   "channels, NVLS off)")
TAIL_LINES = 12


def require_nccl(who: str) -> dict:
    """The loaded libnccl ({path, version}); Unavailable (the backend is WAIVED) when it is older than NEED."""
    found = nccl.loaded()
    why = nccl.too_old(found, who=who)
    if why:
        raise Unavailable(why)
    return found


def share_gpu(ranks_per_gpu: int) -> str | None:
    """Shared-GPU ranks: NCCL refuses two ranks on one GPU unless NCCL_MULTI_RANK_GPU_ENABLE=1 is set before
    its communicator is made. Returns the note a record names (None with one rank per GPU)."""
    if ranks_per_gpu <= 1:
        return None
    os.environ[MULTI_RANK_ENV] = "1"
    return MULTI_RANK_NOTE


class NativeFailure(RuntimeError):
    """A native call failed; the message ends with the last lines the library wrote."""


@contextlib.contextmanager
def native_output(what: str):
    """Run the block with fds 1 and 2 going to a file; pass the text on afterwards; on an exception raise
    NativeFailure naming `what`, the error and the library's last lines."""
    for s in (sys.stdout, sys.stderr):
        s.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as log:
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
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            log.seek(0)
            text = log.read().decode(errors="replace")
        if text:
            sys.stderr.write(text)
            sys.stderr.flush()
        if failure is not None:
            tail = [line for line in text.splitlines() if line.strip()][-TAIL_LINES:]
            said = f"; its last lines: {' | '.join(tail)}" if tail else ""
            raise NativeFailure(f"{what}: {type(failure).__name__}: {failure}{said}") from failure


class NcclFamily(Backend):
    """The NCCL-based backends' shared steps: the gate on the loaded libnccl and the shared-GPU setting before the
    library is touched (`nccl_setup`), and their first dispatch and combine under native_output (`first_call`)."""
    first = True

    def nccl_setup(self, who: str) -> None:
        self.nccl = require_nccl(who)
        shared = share_gpu(self.ranks_per_gpu)
        if shared:
            self.bypassed.append(shared)

    def first_call(self, what: str):
        """The kernels are compiled on the first dispatch and combine: their native output is kept for the error."""
        if self.first:
            return native_output(f"{self.name}'s first {what} (its kernels are compiled at run time)")
        return contextlib.nullcontext()
