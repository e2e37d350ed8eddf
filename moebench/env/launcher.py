"""Whether this process is one rank of a torchrun or srun job, read from the environment once for every
tool (dispatch, check, megatron), with one line naming the variable when the environment is neither a
whole launcher job nor clean.

- torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT together. Any of the first
  three means "a rank of a job": the five must then be whole and consistent (integers, RANK below
  WORLD_SIZE, a port in range), else the ranks would crash in their rendezvous or wait there forever.
- srun marks each task it starts with SLURM_STEP_ID (and SLURM_STEP_NUM_TASKS). Inside an allocation
  (salloc, sbatch) a shell also has SLURM_NTASKS and SLURM_PROCID, without a step: such a process was
  not started by srun, and taking it for rank 0 of SLURM_NTASKS ranks waits for ranks that never come.
  One srun task (SLURM_NTASKS 1) starts its ranks itself, as on a plain machine.
- Rank 0 listens on MASTER_PORT (torchrun's agent does instead, TORCHELASTIC_USE_AGENT_STORE): a port
  in use there fails the rendezvous after the tool has started, so it is checked first (`problem`).
"""
from __future__ import annotations

import os
import socket

TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
TORCHRUN_SETS = "launch with torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT together)"
SPECIAL_STEPS = 0xFFFFFFF0      # Slurm's step ids from here up are the batch, extern and interactive steps


class LaunchEnvError(ValueError):
    """A launcher environment that is partial, garbled or busy: one line, exit 2."""


def _int(e: dict, name: str, low: int, high: int | None, hint: str, high_name: str = "") -> int:
    """e[name] as an integer in [low, high); LaunchEnvError naming the variable otherwise."""
    text = e.get(name, "")
    try:
        v = int(text)
    except ValueError:
        raise LaunchEnvError(f"{name}={text!r} is not an integer; {hint}") from None
    if v < low or (high is not None and v >= high):
        where = f">= {low}" + (f" and below {high_name or high}" if high is not None else "")
        raise LaunchEnvError(f"{name}={v} must be {where}; {hint}")
    return v


def _master(e: dict, who: str, hint: str) -> None:
    if not e.get("MASTER_ADDR", "").strip():
        raise LaunchEnvError(f"MASTER_ADDR is not set, but {who}: export MASTER_ADDR (node 0's address) and "
                             f"MASTER_PORT (a free port) for every rank, or {hint}")
    if "MASTER_PORT" not in e:
        raise LaunchEnvError(f"MASTER_PORT is not set, but {who}: export MASTER_PORT (a free port) for every rank")
    _int(e, "MASTER_PORT", 1, 65536, "give a free TCP port (1-65535)")


def _unset(names) -> str:
    names = list(names)
    return f"unset {', '.join(names[:-1]) + ' and ' if len(names) > 1 else ''}{names[-1]} to start the ranks here"


def _torchrun(e: dict) -> tuple[int, int, int]:
    given = [n for n in TORCHRUN if n in e]
    hint = f"{TORCHRUN_SETS}, or {_unset(given)}"
    missing = [n for n in ("RANK", "WORLD_SIZE") if n not in e]
    if missing:
        raise LaunchEnvError(f"{given[0]}={e[given[0]]} is set without {' and '.join(missing)}: a partial torchrun "
                             f"environment; {hint}")
    world = _int(e, "WORLD_SIZE", 1, None, hint)
    rank = _int(e, "RANK", 0, world, hint, f"WORLD_SIZE={world}")
    local_world = _int(e, "LOCAL_WORLD_SIZE", 1, None, hint) if "LOCAL_WORLD_SIZE" in e else world
    local = _int(e, "LOCAL_RANK", 0, local_world, hint, f"{'LOCAL_' if 'LOCAL_WORLD_SIZE' in e else ''}WORLD_SIZE="
                 f"{local_world}") if "LOCAL_RANK" in e else 0
    _master(e, f"RANK={rank} WORLD_SIZE={world} make this a rank of a launched job", hint)
    return rank, world, local


def _srun(e: dict) -> tuple[int, int, int] | None:
    hint = _unset(("SLURM_NTASKS", "SLURM_PROCID"))
    ntasks = _int(e, "SLURM_NTASKS", 1, None, hint)
    world = _int(e, "SLURM_STEP_NUM_TASKS", 1, None, hint) if "SLURM_STEP_NUM_TASKS" in e else ntasks
    if world == 1:
        return None
    step = e.get("SLURM_STEP_ID", e.get("SLURM_STEPID", "")).strip()
    if not (step.isdigit() and int(step) < SPECIAL_STEPS):
        why = "no SLURM_STEP_ID" if not step else f"SLURM_STEP_ID={step} is not a task step"
        raise LaunchEnvError(f"SLURM_NTASKS={ntasks} is set but srun did not start this process ({why}: a shell "
                             f"inside an allocation): run it as `srun -n {world} python -m moebench...` with "
                             f"MASTER_ADDR and MASTER_PORT exported, or {hint}")
    rank = _int(e, "SLURM_PROCID", 0, world, "launch with srun, which sets it", f"the {world} tasks of the step")
    local = _int(e, "SLURM_LOCALID", 0, None, "srun sets it: launch with srun") if "SLURM_LOCALID" in e else 0
    _master(e, f"srun started {world} tasks", hint)
    return rank, world, local


def joined(env: dict | None = None) -> tuple[int, int, int] | None:
    """(rank, world, local_rank) when this process is a rank of a torchrun or srun job, None when it starts
    its ranks itself. LaunchEnvError (one line naming the variable) for an environment that is neither."""
    e = os.environ if env is None else env
    if any(n in e for n in TORCHRUN):
        return _torchrun(e)
    if "SLURM_NTASKS" in e or "SLURM_PROCID" in e:
        if "SLURM_NTASKS" not in e:
            return None          # SLURM_PROCID alone: no task count, nothing joins (a job's batch shell)
        return _srun(e)
    return None


def shape(env: dict | None = None) -> tuple[int, int, str] | None:
    """(world, ranks on this node, launcher) of the job this process is a rank of, else None."""
    e = os.environ if env is None else env
    j = joined(e)
    if j is None:
        return None
    if any(n in e for n in TORCHRUN):
        return j[1], int(e.get("LOCAL_WORLD_SIZE", j[1])), "torchrun"
    per_node = e.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]      # "8" or "8(x2)"
    return j[1], int(per_node) if per_node.isdigit() and int(per_node) > 0 else j[1], "srun"


def port_busy(port: int) -> bool:
    """True when a socket already listens on `port` here (bound the way rank 0's store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def problem(env: dict | None = None) -> str:
    """'' when the tool may go on (no launcher, or a whole one); else the one line that says what is wrong
    and what to do instead. Checked once, before any work."""
    e = os.environ if env is None else env
    try:
        j = joined(e)
    except LaunchEnvError as err:
        return str(err)
    if j is None:
        return ""
    port = int(e["MASTER_PORT"])
    try:
        socket.getaddrinfo(e["MASTER_ADDR"], port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        return (f"MASTER_ADDR={e['MASTER_ADDR']!r} does not resolve ({getattr(err, 'strerror', None) or err}): "
                "export node 0's address or host name as MASTER_ADDR on every rank")
    if j[0] != 0 or e.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return ""
    if port_busy(port):
        return (f"MASTER_PORT={port} is in use on this host, where rank 0 listens for the other ranks: export a "
                "free port as MASTER_PORT on every rank")
    return ""
