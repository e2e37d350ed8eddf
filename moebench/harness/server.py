"""The rank server: where a process's local rank processes come from (launch.run_ranks).

A fork server (multiprocessing's forkserver) that has imported torch and moebench.harness.launch once: each rank is
forked from it instead of starting a fresh interpreter that imports torch again. A rank takes the environment,
stdout and stderr of its launch (adopt), not those of the server's start.
"""
from __future__ import annotations

import multiprocessing
import os


def rank_server():
    """(the multiprocessing context rank processes start from, the pid of their parent). Started once per process,
    it ends with it. A rank forked from it starts without importing torch (2.2 s for a process's first launch of two
    CPU ranks, 0.06 s for the next on a 2-core machine, where a tool starts every backend's ranks afresh on every
    repeat). It never touches CUDA: each rank makes its own context."""
    from multiprocessing import forkserver
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["moebench.harness.launch"])
    forkserver.ensure_running()
    return ctx, forkserver._forkserver._forkserver_pid


class _Fd:
    """An open file descriptor of the launching process, passed to a rank at its launch (pickled then)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction
        return _opened, (reduction.DupFd(self.fd),)


def _opened(dup) -> int:
    return dup.detach()


def stdio() -> dict:
    """This process's stdout and stderr (those open), pickled with a rank's launch: the rank writes to them."""
    out = {}
    for fd in (1, 2):
        try:
            os.fstat(fd)
            out[fd] = _Fd(fd)
        except OSError:
            pass
    return out


def adopt(env: dict, out_err: dict) -> None:
    """A rank takes the run's environment and its stdout and stderr (the server's are those of its own start), and
    lets go of the rank server's keep-alive pipe, which every child of the server is handed: the server ends when
    the run's process does (that pipe's last writer) and takes its ranks with it (die_with_parent)."""
    from multiprocessing import forkserver
    server = forkserver._forkserver
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    os.environ.clear()
    os.environ.update(env)
    for fd, got in out_err.items():
        if got != fd:
            os.dup2(got, fd)
            os.close(got)
