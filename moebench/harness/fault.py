"""Fault acceptance (`--inject kill:RANK@CALL` / `stall:RANK@CALL:SECONDS`): what the other ranks see when one
dies or stops answering mid-run.

Why: a stack that hangs forever on a lost rank passes every check of healthy ranks, and that is what production
users of EP dispatchers hit (vllm#27774's elastic EP, mori#625's silent hangs, flashinfer#4183's rank mask;
shared/notes/acceptance-asks-2026-12.md). Rank RANK, at its CALL-th timed dispatch call of the api view (after
the barrier, while the other ranks enter that call), writes the wall time to a mark file, then is killed with
SIGKILL or sleeps SECONDS before it makes the call. The launch (`Watch`) then waits for every other rank, the
survivors, to end on its own: an error the stack raises (the library's own, gloo's timeout) or a signal (NCCL's
watchdog aborts the process), for up to --watchdog (default --timeout) after the fault: moebench's watchdog, which
then ends every rank. Every rank is reaped; one still alive a while after its SIGKILL is a hang past both. Verdicts:
- `detects in X s`: every survivor ended on its own, the last one X s after the fault;
- `watchdog only`: a survivor was still inside the call when the watchdog fired;
- `rides out in X s`: (a stall shorter than the stack's timeouts) every rank finished the run, the stalled call
  taking X s;
- `hangs`: a rank outlived moebench's SIGKILL: FAIL, "hangs on a dead peer".
An injected case is FAIL whatever the verdict (it says it was injected and what was seen). The process group's own
timeout (--pg-timeout) is half of the watchdog in an injected run unless given, so that gloo's or NCCL's can fire
first; it holds from the timed calls on: setup and JIT compiles (a rank may compile for a minute while the others
wait in a collective) keep --timeout, which bounds the launch before the fault as any.
"""
from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import time
from dataclasses import dataclass

from ..cli import MAX_WAIT_S
from ..env.native_log import tail_of
from ..records.shapes import Fault
from .launch import FAULT_MARK, FAULT_MARK_ENV, GRACE_S, LaunchError, failure, native_log, signal_name

SYNTAX = "kill:RANK@CALL or stall:RANK@CALL:SECONDS"
REAP_S = 30.0           # how long an ended rank may take to go (a GPU context's teardown) before it counts as a hang
NOT_INJECTED = "not injected"


@dataclass(frozen=True)
class Plan:
    """One fault: `kind` (kill | stall) on `rank` at its `call`-th timed dispatch call (1 = the first), `seconds` of
    stall."""
    kind: str
    rank: int
    call: int
    seconds: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Plan:
        """From the --inject syntax; ValueError (one line, what is wanted) when malformed."""
        m = re.fullmatch(r"(kill|stall):(\d{1,9})@(\d{1,9})(?::([^:]+))?", text.strip())
        if not m or (m[1] == "kill") != (m[4] is None):
            raise ValueError(f"wants {SYNTAX}, got {text!r}")
        try:
            seconds = float(m[4]) if m[4] else 0.0
        except ValueError:
            raise ValueError(f"wants SECONDS a number in {SYNTAX}, got {text!r}") from None
        if int(m[3]) < 1 or (m[1] == "stall" and not 0 < seconds <= MAX_WAIT_S):
            raise ValueError(f"{text!r}: CALL counts from 1, a stall lasts more than 0 s and at most {MAX_WAIT_S:g}")
        return cls(m[1], int(m[2]), int(m[3]), seconds)

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}@{self.call}" + (f":{self.seconds:g}" if self.kind == "stall" else "")

    def problem(self, ep: int, iters: int) -> str:
        """'' when this run can take the fault, else why not (bad input, one line)."""
        if self.rank >= ep:
            return f"--inject {self}: rank {self.rank} is past EP {ep} (ranks 0 to {ep - 1})"
        if ep < 2:
            return f"--inject {self}: EP 1 has no other rank to see the fault"
        if self.call > iters:
            return f"--inject {self}: call {self.call} is past --iters {iters} (the timed dispatch calls, 1 to {iters})"
        return ""

    def what(self) -> str:
        how = "killed with SIGKILL" if self.kind == "kill" else f"stalled {self.seconds:g} s"
        return f"rank {self.rank} {how} at its timed dispatch call {self.call}"


def parse_inject(text: str) -> str:
    """argparse type of --inject: the spec, normalized (one line, exit 2 when malformed)."""
    try:
        return str(Plan.parse(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def injector(plan: Plan | None, rank: int):
    """On the fault's rank, wrap(fn) -> fn that fires the fault at the plan's call; None on the other ranks."""
    if plan is None or plan.rank != rank:
        return None

    def wrap(fn):
        calls = [0]

        def call():
            calls[0] += 1
            if calls[0] == plan.call:
                fire(plan)
            return fn()
        return call
    return wrap


def fire(plan: Plan) -> None:
    """The mark (the fault's wall time, for the launch), then the fault itself."""
    path = os.environ.get(FAULT_MARK_ENV)
    if path:
        with open(path + ".part", "w") as f:
            f.write(repr(time.time()))
        os.replace(path + ".part", path)
    if plan.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(plan.seconds)


def _mark(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


class Watch:
    """Collects the ranks of an injected launch (launch.run_ranks' `watch`): before the fault as any launch, after it
    until every survivor ended on its own or the watchdog fired; `outcome()` says what was seen."""

    reap_s = REAP_S

    def __init__(self, plan: Plan, watchdog_s: float):
        self.plan, self.watchdog_s = plan, watchdog_s
        self.fault_at = self.fired_at = None        # wall times: the fault (its mark), the watchdog firing
        self.ends: dict[int, tuple[float, str, str]] = {}    # rank -> (wall time, done | error | signal, what)
        self.pids: dict[int, int] = {}
        self.left: list[int] = []                   # ranks alive after their SIGKILL (set by the launch)

    def _ended(self, rank: int, how: str, what: str) -> None:
        self.ends.setdefault(rank, (time.time(), how, what))

    def _poll(self, procs, results, got: dict, errors: dict, crash_dir: str) -> None:
        try:
            rank, status, payload = results.get(timeout=0.2)
            (got if status == "ok" else errors)[rank] = payload if status == "ok" else payload.strip()
            self._ended(rank, "done" if status == "ok" else "error", "" if status == "ok" else payload.strip())
        except queue.Empty:
            pass
        for r, p in enumerate(procs):
            if r not in got and r not in errors and p.exitcode not in (None, 0):
                self._ended(r, "signal", f"died with {signal_name(p.exitcode)}" + tail_of(native_log(crash_dir, r)))

    def collect(self, procs, results, world: int, timeout_s: float, crash_dir: str) -> list:
        got, errors = {}, {}
        self.pids = {r: p.pid for r, p in enumerate(procs)}
        deadline, grace_end = time.time() + timeout_s, None
        survivors = [r for r in range(world) if r != self.plan.rank]
        while len(got) < world:
            if self.fault_at is None and (t := _mark(os.path.join(crash_dir, FAULT_MARK))) is not None:
                self.fault_at, deadline = t, t + self.watchdog_s
            self._poll(procs, results, got, errors, crash_dir)
            now = time.time()
            if self.fault_at is None:                   # not injected yet: a failure ends the launch as any
                if self.ends.keys() - got.keys() and grace_end is None:
                    grace_end = now + GRACE_S
                if (grace_end is not None and now > grace_end) or now > deadline:
                    missing = sorted(set(range(world)) - set(got))
                    raise (failure(procs, got, errors, crash_dir) if grace_end is not None else LaunchError(
                        f"ranks {missing} did not finish within {timeout_s:.0f} s (timeout)", crash="hang"))
                continue
            if all(r in self.ends for r in survivors) and any(self.ends[r][1] != "done" for r in survivors):
                break
            if now > deadline:
                self.fired_at = now
                break
        if len(got) == world:
            return [got[r] for r in range(world)]
        raise LaunchError(f"injected {self.plan}: the ranks did not finish (see the record's fault)")

    def outcome(self) -> Fault:
        """What the survivors saw, with the verdict (records/shapes.Fault)."""
        p = self.plan
        if self.fault_at is None:
            return Fault(str(p), p.what(), NOT_INJECTED, None, [], note="the run ended before the fault's call")
        ranks = []
        fired = self.fired_at is not None
        for r, pid in sorted(self.pids.items()):
            t, how, what = self.ends.get(r, (self.fired_at, "ended by moebench" + "'s watchdog" * fired,
                                             "still inside the call" if fired else ""))
            if r == p.rank:
                how, what = ("killed" if p.kind == "kill" else f"stalled, then {how}"), ""
            ranks.append({"rank": r, "pid": pid, "ended": how, "after_s": _after(t, self.fault_at),
                          "seen": what.splitlines()[0][:300] if what else ""})
        seen = [x for x in ranks if x["rank"] != p.rank]
        last = max((x["after_s"] for x in seen if x["after_s"] is not None), default=None)
        if self.left:
            verdict = "hangs"
        elif self.fired_at is not None:
            verdict, last = "watchdog only", _after(self.fired_at, self.fault_at)
        elif all(x["ended"] == "done" for x in seen):
            verdict = f"rides out in {last:.3g} s"
        else:
            verdict = f"detects in {last:.3g} s"
        return Fault(str(p), p.what(), verdict, last, ranks, watchdog_s=self.watchdog_s, left=list(self.left))


def _after(t: float | None, t0: float) -> float | None:
    return None if t is None else round(max(0.0, t - t0), 3)


def judge(watch: Watch, res) -> None:
    """An injected case's result (harness/runner.RankResult) from what the watch saw: its `fault`, and FAIL saying
    what was injected and what was seen; where the fault never fired, the run's own outcome (WAIVED stays WAIVED)
    with that said. A stall ridden out is timed by the stalled call itself (the api view's sample of that call)."""
    f = res.fault = watch.outcome()
    if f.verdict == NOT_INJECTED:
        if res.status != "WAIVED":
            res.status, res.error = "FAIL", "; ".join(filter(None, [res.error, f"--inject {f.injected} never "
                                                                                 f"fired: {f.note}"]))
        return
    samples = ((res.phases or {}).get("dispatch") or {}).get("samples_us") or []
    if f.verdict.startswith("rides out") and len(samples) >= watch.plan.call:
        f.after_s = round(samples[watch.plan.call - 1] * 1e-6, 3)
        f.verdict = f"rides out in {f.after_s:.3g} s"
        f.note = "the stalled call's time (the api view's sample of it, slowest rank)"
    res.status, res.error, res.crash = "FAIL", error_line(f), ("hang" if f.verdict == "hangs" else None)


def error_line(f: Fault) -> str:
    """The injected case's FAIL line: what was injected and what the survivors saw."""
    seen = next((f"rank {x['rank']}: {x['seen']}" for x in f.ranks if x["rank"] != _victim(f) and x["seen"]), "")
    if f.verdict == "hangs":
        head = f"hangs on a dead peer: rank(s) {f.left} still alive {REAP_S:g} s after moebench's SIGKILL"
    elif f.verdict == "watchdog only":
        head = f"watchdog only: no error from the stack {f.after_s:g} s after the fault; moebench's watchdog ended it"
    else:
        head = f.verdict
    return f"injected {f.injected} ({f.what}): {head}" + (f"; {seen}" if seen else "")


def _victim(f: Fault) -> int:
    return Plan.parse(f.injected).rank
