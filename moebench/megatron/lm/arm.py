"""One arm of a Megatron-LM validation: its command, its launch on this machine, and its record.

An arm is the control (`alltoall`) or a candidate dispatcher, trained by Megatron-LM's own
pretrain_gpt.py with exactly the flags `megatron flags` prints for it (args.py builds the rest of the
command, the same for every arm). Locally, each launch is `torchrun --standalone` of
`python -m moebench.megatron.lm.rank` (one process per rank) in a process group of its own, its output
copied to a log file, with a deadline: an arm that hangs is killed with its whole process group and
FAILs, so the other arms still run. The record says PASS only when every iteration was logged, no
iteration was skipped or NaN, and every rank ran the dispatcher class (and flex comm manager) asked for,
on the same arguments.
"""
from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field

from ...core.megatron_map import BACKENDS
from . import log as lm_log


@dataclass
class Launch:
    """Where an arm's ranks run: nodes x ranks per node, ranks_per_gpu > 1 for shared-GPU ranks."""
    device: str                    # cuda | cpu
    nproc_per_node: int
    ep: int
    nnodes: int = 1
    ranks_per_gpu: int = 1
    launcher: str = "torchrun --standalone (moebench)"

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def functional(self) -> bool:
        from ...harness.placement import Placement
        return Placement(self.device, self.world, self.ranks_per_gpu).functional

    def asdict(self) -> dict:
        return {**asdict(self), "world": self.world, "functional": self.functional}


@dataclass
class ArmPlan:
    role: str                      # control | candidate
    dispatcher: str
    megatron_argv: list[str]       # PATH/pretrain_gpt.py + arguments
    dispatcher_flags: list[str]
    env: dict[str, str]
    flags: dict                    # FlagSet.asdict()


@dataclass
class LaunchResult:
    rc: int | None
    wall_s: float
    log: str
    command: list[str]
    timed_out: bool = False
    ranks: list[dict] | None = None
    notes: list[str] = field(default_factory=list)


def torchrun_command(launch: Launch, meta_path: str, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(launch.nproc_per_node), "-m", "moebench.megatron.lm.rank", "--meta", meta_path,
            "--", *argv]


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the launch's whole process group, SIGKILL after a grace period: nothing outlives it."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_local(cmd: list[str], env: dict[str, str], log_path: str, timeout_s: float, on_line=None) -> tuple[int | None, bool]:
    """Run `cmd` in its own process group, its output into `log_path` (and each line to on_line);
    (exit code, timed out). An interrupt kills the group and propagates."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

        def pump():
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if on_line:
                    on_line(line)
        reader = threading.Thread(target=pump, daemon=True, name="moebench-arm-log")
        reader.start()
        try:
            rc, hung = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, hung = proc.returncode, True
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            if proc.poll() is None:
                _kill_group(proc)
        reader.join(timeout=10)
    return rc, hung


def describe_rc(rc: int | None) -> str:
    if rc is None:
        return "no exit code"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


# ---------------------------------------------------------------- what the arm's record says
def steady(iterations: list[lm_log.Iteration], window: int) -> dict | None:
    win = [i for i in iterations[-window:] if i.elapsed_ms is not None]
    if not win:
        return None
    ms = [i.elapsed_ms for i in win]
    tf = [i.tflops_per_gpu for i in win if i.tflops_per_gpu is not None]
    return {"window": len(win), "first_iteration": win[0].iteration, "mean_ms": statistics.fmean(ms),
            "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "samples_ms": ms,
            "tflops_per_gpu_mean": statistics.fmean(tf) if tf else None}


def iteration_problems(log: lm_log.MegatronLog, iters: int) -> list[str]:
    got = {i.iteration for i in log.iterations if i.elapsed_ms is not None}
    out = []
    if len(got) < iters:
        out.append(f"Megatron logged {len(got)} of {iters} iterations")
    if log.nan:
        out.append(f"{log.nan} NaN iteration(s)")
    if log.skipped:
        out.append(f"{log.skipped} skipped iteration(s)")
    no_loss = [i.iteration for i in log.iterations if i.lm_loss is None and not i.nan]
    if no_loss:
        out.append(f"no lm loss logged at iteration(s) {no_loss[:5]}")
    bad = [i.iteration for i in log.iterations if i.elapsed_ms is not None
           and not (isinstance(i.elapsed_ms, (int, float)) and math.isfinite(i.elapsed_ms) and i.elapsed_ms > 0)]
    if bad:
        out.append(f"elapsed time per iteration not a finite positive number at iteration(s) {bad[:5]}")
    return out


def evidence_problems(ranks: list[dict], dispatcher: str, world: int) -> list[str]:
    """Proof from the run itself, on every rank: the requested dispatcher class (and comm manager) served
    every token_dispatch call, the flex buffer was built, and all ranks parsed the same arguments."""
    mb = BACKENDS[dispatcher]
    out = []
    if len(ranks) != world:
        out.append(f"{len(ranks)} of {world} ranks reported")
    for r in ranks:
        ev, who = r.get("evidence") or {}, f"rank {r.get('rank')}"
        ran = ev.get("dispatchers") or []
        if not ran:
            out.append(f"{who}: no token dispatcher ran" + (f" ({ev['error']})" if ev.get("error") else ""))
        for d in ran:
            if d["class"] != mb.dispatcher_class or (mb.manager_class and d["manager"] != mb.manager_class):
                got = d["class"] + (f"/{d['manager']}" if d["manager"] else "")
                want = mb.dispatcher_class + (f"/{mb.manager_class}" if mb.manager_class else "")
                out.append(f"{who}: {got} served {d['calls']} dispatch(es), expected {want}")
        if mb.flex and not ev.get("buffer"):
            out.append(f"{who}: no {dispatcher} buffer was built in Megatron's fused_a2a")
        got_type = (r.get("args") or {}).get("moe_token_dispatcher_type")
        if got_type is not None and got_type != mb.dispatcher_type:
            out.append(f"{who}: Megatron parsed --moe-token-dispatcher-type {got_type}, expected {mb.dispatcher_type}")
    digests = {r.get("args_digest") for r in ranks if r.get("args_digest")}
    if len(digests) > 1:
        out.append(f"ranks parsed different arguments ({len(digests)} different sets)")
    return out


def rank_memory(ranks: list[dict]) -> list[dict]:
    return [{"rank": r.get("rank"), **(r.get("memory") or {})} for r in ranks]


def evidence_rows(ranks: list[dict]) -> list[dict]:
    return [{"rank": r.get("rank"), "host": r.get("host"), "local_rank": r.get("local_rank"),
             "dispatchers": (r.get("evidence") or {}).get("dispatchers"), "buffer": (r.get("evidence") or {}).get("buffer"),
             "args": r.get("args"), "args_digest": r.get("args_digest"), "setup": r.get("setup")} for r in ranks]


def container_version() -> dict:
    """The container's own version, where its environment names one (NGC and NeMo images do)."""
    names = ("NVIDIA_PYTORCH_VERSION", "PYTORCH_BUILD_VERSION", "NVIDIA_BUILD_ID", "NEMO_VERSION",
             "NGC_CONTAINER_VERSION", "CONTAINER_VERSION", "NVIDIA_PRODUCT_NAME", "CUDA_VERSION")
    return {k: os.environ[k] for k in names if os.environ.get(k)}


def make_record(arm: ArmPlan, ctx: dict, repeat: int, order: int, res: LaunchResult, window: int, iters: int):
    """The arm's record from its launch. ctx: lm_plan.Plan.context()."""
    from ...records.megatron import ArmRecord
    from ...records.provenance import provenance, utc_now
    launch: Launch = ctx["launch"]
    ranks = res.ranks
    lines = [ln for r in ranks for ln in r.get("lines") or []] if ranks else _read(res.log)
    log = lm_log.parse(lines)
    errors = list(res.notes)
    if res.timed_out:
        errors.append(f"hang: the arm did not end within its timeout ({res.wall_s:.0f} s) and was killed")
    elif res.rc not in (0, None):
        errors.append(f"the launch ended with {describe_rc(res.rc)}")
    if ranks is None and not res.timed_out:
        errors.append("no rank report: training did not finish")
    errors += iteration_problems(log, iters)
    if ranks:
        errors += evidence_problems(ranks, arm.dispatcher, launch.world)
    error_lines = lm_log.parse(_read(res.log)).error_lines if errors and res.log else []
    env = {**provenance(), "container": container_version(), "topology": ctx.get("topology")}
    return ArmRecord(
        validation=ctx["validation"], role=arm.role, dispatcher=arm.dispatcher, repeat=repeat, order=order,
        status="FAIL" if errors else "PASS", errors=list(dict.fromkeys(errors)), megatron_argv=arm.megatron_argv,
        command=res.command, dispatcher_flags=arm.dispatcher_flags, env_set=arm.env, flags=arm.flags,
        megatron_lm=ctx["checkout"], no_te_flags=ctx["no_te"], launch=launch.asdict(), window=window,
        iterations=[asdict(i) for i in log.iterations], steady=steady(log.iterations, window),
        memory={"megatron": [asdict(m) for m in log.memory], "ranks": rank_memory(ranks or [])},
        evidence=evidence_rows(ranks or []), megatron_args=log.args, error_lines=error_lines,
        functional=launch.functional, env=env, wall_s=round(res.wall_s, 1), log=res.log,
        start_utc=ctx.get("start_utc", ""), end_utc=utc_now())


def _read(path: str | None) -> list[str]:
    if not path or not os.path.isfile(path):
        return []
    with open(path, errors="replace") as f:
        return f.read().splitlines()
