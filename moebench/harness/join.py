"""A torchrun or srun job's ranks meeting once, before any work: the job's store, joined in Python steps.

torch's own rendezvous (init_process_group over env://) waits inside C++ for every rank: it says nothing of
what it waits for, and a Ctrl-C or SIGTERM does not reach Python until it returns. A job whose other ranks
never start (one `python -m moebench.dispatch` in a shell that has torchrun's variables) then sits there
(issue 35). Here rank 0 (or torchrun's agent, TORCHELASTIC_USE_AGENT_STORE) holds the store on MASTER_PORT,
every rank checks in with short steps, says after a few seconds what it waits for, and gives up after the
run's --timeout. The process groups of the run are then made on this one store, each under its own prefix
(every rank makes the same sequence of groups).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time

import torch.distributed as dist

STEP_S = 2.0           # the longest one C++ call of the join may block (a Ctrl-C waits at most this)
SAY_AFTER_S = 5.0      # a join not complete by then says what it waits for


class JoinError(RuntimeError):
    """The job's ranks did not all join: one line."""


_store: dist.Store | None = None
_failed = ""
_groups = 0
_said = 0


def _listening(addr: str, port: int) -> bool:
    """Something accepts connections there (tried first: torch's client logs a C++ trace per failed try)."""
    try:
        with socket.create_connection((addr, port), timeout=STEP_S):
            return True
    except OSError:
        return False


def _connect(addr: str, port: int, world: int, host: bool) -> dist.Store | None:
    if not host and not _listening(addr, port):
        return None
    try:
        return dist.TCPStore(addr, port, world, host, timeout=datetime.timedelta(seconds=STEP_S),
                             wait_for_workers=False)
    except (RuntimeError, OSError) as e:   # DistNetworkError / DistStoreError: no store there yet
        if host:                           # the port taken since launcher.problem() found it free
            raise JoinError(f"rank 0 cannot listen on MASTER_PORT={port} ({str(e).splitlines()[0][:200]}): "
                            "export a free port as MASTER_PORT on every rank") from None
        return None


def _meet(rank: int, world: int, timeout_s: float, say) -> dist.Store:
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    host = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    key = f"moebench/joined/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    start, said, store, joined = time.monotonic(), False, None, 0
    while True:
        if store is None and (store := _connect(addr, port, world, host)) is not None:
            joined = store.add(key, 1)                 # this rank checks in once
        elif store is not None:
            joined = store.add(key, 0)
        if joined >= world:
            return store
        waited = time.monotonic() - start
        if waited > timeout_s:
            raise JoinError(f"only {joined} of {world} ranks joined at {addr}:{port} within {timeout_s:.0f} s "
                            "(--timeout): start every rank (torchrun --nproc-per-node, srun -n), or unset RANK, "
                            "WORLD_SIZE and LOCAL_RANK (SLURM_NTASKS) to start the ranks here")
        if not said and waited > SAY_AFTER_S:
            say(f"# rank {rank} of {world}: waiting for the job's other ranks at {addr}:{port} ({joined} joined; "
                f"gives up after {timeout_s:.0f} s, Ctrl-C stops)")
            said = True
        time.sleep(0.2)


def join(rank: int, world: int, timeout_s: float, say=None) -> str:
    """'' once every rank of the job has joined (the first call waits, later ones return at once), else the
    one line that says why not (a failed join is not tried again: the run's later groups fail at once)."""
    global _store, _failed
    if _store is None and not _failed:
        try:
            _store = _meet(rank, world, timeout_s, say or (lambda m: print(m, file=sys.stderr, flush=True)))
        except JoinError as e:
            _failed = str(e)
    return _failed


def group_store(rank: int, world: int, timeout_s: float) -> dist.Store:
    """The store of the run's next process group (joining first); JoinError when the job's ranks did not."""
    global _groups
    if join(rank, world, timeout_s):
        raise JoinError(_failed)
    _groups += 1
    return dist.PrefixStore(f"moebench/group{_groups}", _store)


def from_rank0(rank: int, value, timeout_s: float):
    """rank 0's `value` on every rank of the job, in call order (JSON through the job's store): a choice the
    ranks must make alike (which sweep cases are done, by rank 0's --out) is rank 0's alone."""
    global _said
    _said += 1
    key = f"moebench/from-rank0/{_said}"
    if rank == 0:
        _store.set(key, json.dumps(value))
        return value
    deadline = time.monotonic() + timeout_s
    while not _store.check([key]):
        if time.monotonic() > deadline:
            raise JoinError(f"rank 0 said nothing for {timeout_s:.0f} s (--timeout): it stopped or hangs")
        time.sleep(0.05)
    return json.loads(_store.get(key))
