"""Fault acceptance per backend (`fault.BACKEND`): does the stack end a run whose peer died or stopped answering,
or does it hang? A production team signs a container only if a lost rank is detected, not waited on forever
(shared/notes/acceptance-asks-2026-12.md).

Each check runs two injected runs of the backend (harness/fault.py), as `python -m moebench.dispatch --inject` runs
them, side by side, each in its own child (checks/child.py) with its own ranks: rank 1 killed with SIGKILL at its
second timed dispatch call, and rank 1 stalled there for longer than the watchdog. Where the round trips run
(placement.for_roundtrip): one rank per GPU, else 2 ranks sharing GPU 0 (functional), else 2 CPU ranks. PASS when
the stack ends each run in bounded time: with its own error (`detects in X s`), or by moebench's watchdog
`--watchdog` s after the fault (`watchdog only`); FAIL when a rank outlives moebench's SIGKILL or the child outlives
its deadline (`hangs on a dead peer`), or the backend failed before the fault; the seconds either way. WAIVED where
the backend cannot run here (the reason). These checks run only when named (`-t fault`, `-t fault.deepep`,
`-p fault`): each may wait out a watchdog.
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

from ..backends import base
from . import child
from .comm import gpu_count
from .ep import roundtrip_spec
from .registry import Context, failed, passed, register, waived

CALL = 2                     # the timed dispatch call the fault comes at (a call has run before it)
SIZES = (2, 4, 8)            # one rank per GPU on these counts (as DeepEP's round trip), else 2 ranks on GPU 0


def plans(watchdog_s: float) -> tuple[str, str]:
    """The two faults: a kill, and a stall that outlasts the watchdog (a peer that does not come back in time)."""
    return f"kill:1@{CALL}", f"stall:1@{CALL}:{2 * watchdog_s + 30:g}"


def fault_child(argv: list[str]) -> list[dict]:
    """Child side: one injected run's records, as moebench.dispatch makes them (harness/runner.run_case)."""
    from ..harness.runner import run_case
    from ..harness.spec import RunSpec
    return run_case(RunSpec.from_argv(argv).replace(measure_ceiling=False).check(), progress=lambda *_: None)


def check_fault(ctx: Context, backend: str):
    from ..harness.fault import REAP_S
    from ..harness.placement import for_roundtrip
    from ..harness.runner import waiver
    o = ctx.options
    at = for_roundtrip(gpu_count(), SIZES)
    runs = [roundtrip_spec(backend, at, min(o.num_tokens, o.ll_num_tokens), o, {}).replace(
        inject=p, iters=CALL + 1, views=("api",), watchdog_s=o.watchdog) for p in plans(o.watchdog)]
    why = waiver(backend, runs[0])
    if why:
        return waived(f"{backend}: {why}")
    where = f"EP {at.ranks}" + (f" ({at.note})" if at.note else "")
    bound = o.timeout + o.watchdog + REAP_S + 70
    with ThreadPoolExecutor(len(runs)) as pool:     # the two faults at once: each child's setup is most of its time
        done = list(pool.map(lambda run: child.run_function("moebench.checks.fault:fault_child", {
            "argv": run.to_argv()}, bound, env={"PYTHONFAULTHANDLER": "1"}), runs))
    for run, r in zip(runs, done):
        if r.timed_out:
            return failed(f"{backend} {where}: hangs on a dead peer: the {run.inject} run did not end within "
                          f"{bound:.0f} s (past the stack's timeouts and moebench's watchdog); its child was killed",
                          seconds=r.seconds, stderr=r.stderr_tail())
        if not r.ok:
            return failed(f"{backend} {where}: the {run.inject} run {r.failure()}", stderr=r.stderr_tail())
    return judge(backend, where, [r.value for r in done])


def judge(backend: str, where: str, runs: list[list[dict]]):
    """One outcome from each injected run's records: their faults' verdicts and seconds."""
    faults, said = [], []
    for recs in runs:
        f = next((rec["fault"] for rec in recs if rec.get("fault")), None)
        status = {rec["check"]["status"] for rec in recs}
        err = next((rec["check"].get("error") for rec in recs if rec["check"].get("error")), "") or ""
        if f is None or f["verdict"] == "not injected":
            if status == {"WAIVED"}:
                return waived(f"{backend}: {err}")
            return failed(f"{backend} {where}: failed before the fault: {err}", errors=[err])
        faults.append(f)
        said.append(f"{f['injected']} {f['verdict']}" + (f" ({f['after_s']:g} s)" if f["verdict"] == "watchdog only"
                                                          else ""))
    summary = f"{backend} {where}: " + "; ".join(said)
    if any(f["verdict"] == "hangs" for f in faults):
        return failed(f"{summary}: hangs on a dead peer", faults=faults)
    return passed(summary + "; every rank reaped", faults=faults)


for _name in base.names():
    register(f"fault.{_name}", f"(only when named) {_name}'s rank 1 killed, then stalled, mid-run: PASS when the "
             "others detect it or the watchdog ends them (s), FAIL when it hangs", optional=True)(
        functools.partial(check_fault, backend=_name))
