"""Run a per-rank function on every EP rank: local ranks forked from one rank server, or join a torchrun/Slurm job.

Every collective carries the process-group timeout, and the parent waits on its children with a
deadline: a rank that raises, crashes or hangs ends the run with a non-zero exit and that rank's
error, never a hang. Local ranks use gloo on CPU and NCCL on GPU.

Shared-GPU ranks (`ranks_per_gpu` > 1): several rank processes on one GPU (rank r on GPU
r // ranks_per_gpu), for functional runs of the real backends where fewer GPUs are lent than EP
ranks. NCCL refuses two ranks on one device ("Duplicate GPU detected"), so the group is gloo;
backends exchange their CUDA IPC handles through it, and IPC works between processes on one
device. The ranks' kernels time-slice the GPU: such times are functional only.
"""
from __future__ import annotations

import contextlib
import datetime
import faulthandler
import multiprocessing
import os
import pickle
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

from ..env import launcher
from ..env.native_log import NATIVE_LOG_ENV, tail_of

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def quiet_stop_signals() -> None:
    """SIGINT and SIGTERM end this process at once, without a word (the default action, no Python
    handler). A rank starts with both blocked (run_ranks blocks them while it starts them), so one that
    came during its start-up is delivered here, not as a KeyboardInterrupt traceback from an import.
    A SIGINT the tool ignores (started by a script as `tool &`: the shell sets SIG_IGN, and exec keeps it)
    stays ignored in its ranks, so a Ctrl-C meant for the script's foreground job cannot end them."""
    for s in STOP_SIGNALS:
        if not (s == signal.SIGINT and signal.getsignal(s) == signal.SIG_IGN):
            signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


if multiprocessing.parent_process() is not None:    # a child process of multiprocessing importing this module
    quiet_stop_signals()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from . import join  # noqa: E402  (torch: after the stop signals, as above)
from .server import adopt, rank_server, stdio  # noqa: E402


class LaunchError(RuntimeError):
    """A rank failed, crashed or timed out; `crash` names the signal that killed a rank, or "hang"."""

    def __init__(self, msg: str, crash: str | None = None):
        super().__init__(msg)
        self.crash = crash


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    group: object            # the EP process group (the world group)
    local_rank: int = 0
    ranks_per_gpu: int = 1   # > 1: shared-GPU ranks (gloo group, functional only)
    group_ms: float | None = None   # this rank's init_process_group (records' setup: harness/setupcost.py)


def joined_env() -> tuple[int, int, int] | None:
    """(rank, world, local_rank) when started by torchrun or srun, else None (env/launcher.py decides; the
    tools refuse a partial or garbled launcher environment before any work: launcher.problem)."""
    return launcher.joined()


def is_lead() -> bool:
    """This process reports and writes the records: it starts its own ranks, or it is rank 0 of its job."""
    joined = joined_env()
    return joined is None or joined[0] == 0


def join_problem(timeout_s: float) -> str:
    """'' when this process starts its own ranks, or once every rank of its torchrun/srun job has joined
    (harness/join.py: bounded by timeout_s, Ctrl-C stops it); else the one line why not. Tools call it before
    any work, so a job whose other ranks never start is one refusal, not a FAIL per backend."""
    joined = joined_env()
    return join.join(joined[0], joined[1], timeout_s) if joined else ""


@contextlib.contextmanager
def environment(env: dict):
    """Environment variables for the rank processes started inside (each rank takes its launch's environment)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def rendezvous(timeout_s: float):
    """A local launch's store, held by this process on the port the kernel gives it: a port probed free for rank 0 to
    listen on later can be taken in between (EADDRINUSE: another launch's probe, or any process's outgoing
    connection, whose ports come from the same range)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def gpu_of(local_rank: int, ranks_per_gpu: int = 1) -> int:
    """The GPU a local rank runs on: ranks_per_gpu consecutive ranks share one GPU."""
    return local_rank // ranks_per_gpu


def pg_backend(device_type: str, ranks_per_gpu: int = 1) -> str:
    """gloo on CPU and for shared-GPU ranks (NCCL wants one rank per GPU), else NCCL."""
    return "nccl" if device_type == "cuda" and ranks_per_gpu == 1 else "gloo"


def _init(rank: int, world: int, local_rank: int, device_type: str, timeout_s: float,
          ranks_per_gpu: int = 1, store=None, pg_timeout_s: float | None = None) -> RankContext:
    """The rank's device and process group. pg_timeout_s: the group's own timeout once every rank has joined (gloo's
    wait, NCCL's watchdog; --pg-timeout), where it differs from timeout_s, the bound of the rendezvous."""
    if device_type == "cuda":
        device = torch.device("cuda", gpu_of(local_rank, ranks_per_gpu))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if device_type != "cuda" or ranks_per_gpu > 1:
        # ranks that work on the host (CPU ranks; shared-GPU ranks check there) get one thread each: with torch's
        # default (every core) per rank, a soak's host check of EP 2, T 64 took ~290 ms a call on a 16-core
        # H100 host; on one thread 12-19 ms (bench/results/dispatch-shared-soak-h100.jsonl, stage_ms)
        torch.set_num_threads(1)
    backend = pg_backend(device_type, ranks_per_gpu)
    kw = {"device_id": device} if backend == "nccl" else {}
    t0 = time.perf_counter()
    dist.init_process_group(backend, rank=rank, world_size=world, store=store,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)
    group_ms = (time.perf_counter() - t0) * 1e3
    if pg_timeout_s is not None and pg_timeout_s != timeout_s:
        set_pg_timeout(pg_timeout_s)
    return RankContext(rank, world, device, dist.group.WORLD, local_rank, ranks_per_gpu, group_ms)


def set_pg_timeout(seconds: float, group=None) -> None:
    """The process group's own timeout from now on (gloo's wait, NCCL's watchdog): the collectives started after."""
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=seconds), group)


PR_SET_PDEATHSIG = 1
OOM_HINT = (", likely out of memory (the kernel's OOM killer sends SIGKILL; lower --num-tokens, --hidden or --ep, "
            "and see the memory estimate in moebench/harness/preflight.py)")


def die_with_parent(parent_pid: int) -> None:
    """A rank never outlives the run that started it (SIGKILL or SIGTERM to the parent): the kernel's
    parent-death signal (Linux prctl), and a watchdog thread on the parent pid where that is missing. The parent
    is the rank server (rank_server), which ends when the run does.
    SIGINT and SIGTERM end a rank at once (the default action: no handler, no traceback); the terminal's
    Ctrl-C reaches every rank, and the parent forwards SIGTERM (run_ranks' cleanup)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    quiet_stop_signals()
    if os.getppid() != parent_pid:          # the parent died before prctl took hold
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="moebench-parent-watch").start()


def _watch_parent(parent_pid: int, every_s: float = 1.0) -> None:
    while os.getppid() == parent_pid:
        time.sleep(every_s)
    os._exit(1)


FAULT_MARK = "fault-mark"                  # the file a rank injected with a fault writes first (harness/fault.py)
FAULT_MARK_ENV = "MOEBENCH_FAULT_MARK"     # ... its path, in each rank's environment


def _child(rank, world, device_type, timeout_s, port, payload, results, ranks_per_gpu, parent_pid, crash_dir,
           pg_timeout_s, env, out_err):
    die_with_parent(parent_pid)
    adopt(env, out_err)
    fn, args = pickle.loads(payload)       # after the environment: the imports it makes may read it
    if crash_dir and faulthandler.is_enabled():    # a crash dump of its own: ranks dying together would interleave
        faulthandler.enable(file=open(os.path.join(crash_dir, f"rank{rank}"), "w"), all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if crash_dir:
        os.environ[NATIVE_LOG_ENV] = native_log(crash_dir, rank)
        os.environ[FAULT_MARK_ENV] = os.path.join(crash_dir, FAULT_MARK)
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        ctx = _init(rank, world, rank, device_type, timeout_s, ranks_per_gpu, store, pg_timeout_s)
        out = fn(ctx, *args)
        results.put((rank, "ok", out))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-8)}"))
        raise SystemExit(1)


def run_ranks(fn, world: int, device_type: str = "cpu", timeout_s: float = 300.0, args: tuple = (),
              ranks_per_gpu: int = 1, pg_timeout_s: float | None = None, watch=None) -> list:
    """fn(ctx, *args) on `world` ranks; returns every rank's result, in rank order (rank 0's
    process only when joined to torchrun/Slurm: other ranks get []). pg_timeout_s: the process group's own
    timeout (default timeout_s). watch: a fault.Watch that collects the ranks of an injected run instead (its
    `left`: the ranks still alive once they were ended)."""
    joined = joined_env()
    if joined is not None:
        return _run_joined(fn, joined, device_type, timeout_s, args, ranks_per_gpu, pg_timeout_s)
    store = rendezvous(timeout_s)
    port = store.port
    crash_dir = tempfile.mkdtemp(prefix="moebench-crash-")
    payload, env, out_err = pickle.dumps((fn, args)), dict(os.environ), stdio()
    # blocked while the ranks start, and for good in the rank server started here: the ranks inherit it (see
    # quiet_stop_signals), and the server ends with this process, not on a signal
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        ctx, server = rank_server()
        results = ctx.Queue()
        procs = [ctx.Process(target=_child, args=(r, world, device_type, timeout_s, port, payload, results,
                                                  ranks_per_gpu, server, crash_dir, pg_timeout_s, env, out_err),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        return (watch.collect if watch else _collect)(procs, results, world, timeout_s, crash_dir)
    finally:
        left = _end(procs, reap_s=watch.reap_s if watch else 5.0)
        if watch:
            watch.left = left
        _replay_crash_dumps(crash_dir)


def _end(procs, grace_s: float = 2.0, reap_s: float = 5.0) -> list[int]:
    """Every rank still alive gets SIGTERM at once (a rank ended first would let the others print their
    lost connections), then SIGKILL after a grace period; all are reaped, each waited for up to reap_s after its
    SIGKILL. Returns the ranks still alive then (a process the kernel cannot end: stuck in a driver)."""
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=reap_s)
    return [r for r, p in enumerate(procs) if p.is_alive()]


def native_log(crash_dir: str, rank: int) -> str:
    """The file a rank's native output goes to while a backend listens (env/native_log.py)."""
    return os.path.join(crash_dir, f"native-rank{rank}")


def _replay_crash_dumps(crash_dir: str) -> None:
    """Each crashed rank's faulthandler dump (and native output a crash cut off) to stderr, one rank after another
    (never interleaved)."""
    for name in sorted(set(os.listdir(crash_dir)) - {FAULT_MARK}):
        with open(os.path.join(crash_dir, name), errors="replace") as f:
            dump = f.read()
        if dump.strip():
            sys.stderr.write(f"# {name}:\n{dump}")
    sys.stderr.flush()
    shutil.rmtree(crash_dir, ignore_errors=True)


GRACE_S = 2.0     # after a rank's failure, the others' reports are awaited this long (fault.py's before its fault)


def _take(results, got: dict, errors: dict, wait_s: float) -> bool:
    """One rank's report off the queue into got or errors, waiting up to wait_s; False when none came."""
    try:
        rank, status, payload = results.get(timeout=wait_s)
    except queue.Empty:
        return False
    (got.__setitem__(rank, payload) if status == "ok" else errors.__setitem__(rank, payload.strip()))
    return True


def _collect(procs, results, world: int, timeout_s: float, crash_dir: str | None = None) -> list:
    """Rank results in order. On the first failure, wait a moment (GRACE_S) for the others to report too, no
    longer than until every rank has reported or died, then name the root cause first: a rank killed by a signal
    before the ranks that lost it, with the last lines its native libraries wrote where a backend was listening
    (an abort's own message)."""
    got: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    grace_end = None
    while len(got) + len(errors) < world:
        now = time.monotonic()
        if grace_end is not None and now > grace_end:
            break
        _take(results, got, errors, 0.2)
        dead = [r for r, p in enumerate(procs) if r not in got and r not in errors
                and p.exitcode not in (None, 0)]
        if dead and len(got) + len(errors) + len(dead) == world:     # nobody left to wait for
            while _take(results, got, errors, 0.05):                 # what a rank sent just before it exited
                pass
            break
        if (errors or dead) and grace_end is None:
            grace_end = time.monotonic() + GRACE_S
        if grace_end is None and now > deadline:
            missing = sorted(set(range(world)) - set(got))
            raise LaunchError(f"ranks {missing} did not finish within {timeout_s:.0f} s (timeout)", crash="hang")
    if len(got) == world:
        return [got[r] for r in range(world)]
    raise failure(procs, got, errors, crash_dir)


def failure(procs, got: dict, errors: dict, crash_dir: str | None) -> LaunchError:
    """The error of a launch whose ranks did not all report: a rank killed by a signal before the ranks that lost
    it, with its native libraries' last lines, then every rank's error."""
    dead = [(r, p.exitcode, signal_name(p.exitcode)) for r, p in enumerate(procs)
            if r not in got and r not in errors and p.exitcode not in (None, 0)]
    crashed = [f"rank {r} died with exit code {code} ({how}) before reporting" + (OOM_HINT if how == "SIGKILL" else "")
               + (tail_of(native_log(crash_dir, r)) if crash_dir else "") for r, code, how in dead]
    failed = [f"rank {r} failed: {e}" for r, e in sorted(errors.items())]
    return LaunchError("; ".join(crashed + failed) or "ranks stopped without reporting",
                       crash=next((how for _, _, how in dead if how.startswith("SIG")), None))


def signal_name(code: int) -> str:
    if code is not None and code < 0:
        import signal
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return "error exit"


def _run_joined(fn, joined, device_type, timeout_s, args, ranks_per_gpu=1, pg_timeout_s=None) -> list:
    rank, world, local_rank = joined
    try:
        store = join.group_store(rank, world, timeout_s)
    except join.JoinError as e:
        raise LaunchError(str(e), crash="hang") from None
    ctx = _init(rank, world, local_rank, device_type, timeout_s, ranks_per_gpu, store, pg_timeout_s)
    try:
        out = fn(ctx, *args)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(out, gathered, dst=0)
        return gathered if rank == 0 else []
    except Exception as e:  # noqa: BLE001 - another rank died mid-run (gloo: connection reset): one line, FAIL
        raise LaunchError(f"rank {rank} of the job: {type(e).__name__}: {str(e).splitlines()[0][:300]} (a rank of "
                          "the job failed or was stopped)") from None
    finally:
        dist.destroy_process_group()
