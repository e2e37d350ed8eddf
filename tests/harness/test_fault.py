"""Fault acceptance (--inject, harness/fault.py): a rank killed or stalled mid-run; what the others saw, how soon,
the verdict (detects / watchdog only / rides out / hangs), every rank reaped, the case FAIL saying so."""
import json

import pytest
import torch
import torch.distributed as dist

from conftest import alive
from moebench.harness import fault
from moebench.harness.fault import Plan, Watch
from moebench.harness.launch import LaunchError, run_ranks
from moebench.harness.runner import RankResult

TINY = ["--device", "cpu", "--ep", "2", "--num-tokens", "16", "--hidden", "64", "--num-experts", "8", "--topk", "2",
        "--backend", "alltoall"]


def test_the_fault_syntax_reads_back_and_says_what_is_wrong():
    assert Plan.parse("kill:1@2") == Plan("kill", 1, 2) and str(Plan.parse(" stall:0@3:2.5")) == "stall:0@3:2.5"
    for bad in ("kill:1", "kill:1@2:5", "stall:1@2", "stall:1@2:x", "stall:1@2:0", "oops:1@2", "kill:1@0", "kill:-1@2"):
        with pytest.raises(ValueError):
            Plan.parse(bad)
    assert "past EP 2" in Plan("kill", 2, 1).problem(2, 5) and "past --iters 5" in Plan("kill", 1, 6).problem(2, 5)
    assert "EP 1" in Plan("kill", 0, 1).problem(1, 5) and Plan("stall", 1, 5, 1.0).problem(2, 5) == ""


def allreduce_calls(ctx, plan):
    """Three all_reduce calls, the fault's rank wrapped as the api view wraps its timed dispatch calls."""
    wrap = fault.injector(plan, ctx.rank)
    call = lambda: dist.all_reduce(torch.ones(4))  # noqa: E731
    call = wrap(call) if wrap else call
    for _ in range(3):
        call()
    return ctx.rank


def test_a_peer_stalled_past_the_stack_is_watchdog_only_and_every_rank_is_reaped():
    """gloo's own timeout (60 s) is past the watchdog (2 s): the survivor is still inside the call when the watchdog
    fires; both ranks are ended and reaped, none outlives the run."""
    plan = Plan("stall", 1, 2, 120.0)
    watch = Watch(plan, watchdog_s=2.0)
    with pytest.raises(LaunchError, match="injected stall:1@2:120"):
        run_ranks(allreduce_calls, 2, "cpu", timeout_s=60, args=(plan,), pg_timeout_s=60, watch=watch)
    f = watch.outcome()
    assert f.verdict == "watchdog only" and 2.0 <= f.after_s < 5, f
    survivor, victim = f.ranks
    assert survivor["ended"] == "ended by moebench's watchdog" and survivor["seen"] == "still inside the call"
    assert victim["ended"].startswith("stalled") and f.left == []
    assert not any(alive(x["pid"]) for x in f.ranks)


def watched(plan, ends, fired=None, left=()):
    w = Watch(plan, 10.0)
    w.fault_at, w.fired_at, w.left = 100.0, fired, list(left)
    w.pids = {0: 11, 1: 12}
    w.ends = {r: (100.0 + t, how, what) for r, (t, how, what) in ends.items()}
    return w


def test_verdicts_from_what_the_ranks_did():
    kill = Plan("kill", 1, 2)
    seen = {0: (0.5, "error", "RuntimeError: Connection reset by peer\nTraceback ..."), 1: (0.0, "signal", "x")}
    f = watched(kill, seen).outcome()
    assert (f.verdict, f.after_s) == ("detects in 0.5 s", 0.5)
    assert f.ranks[0]["seen"] == "RuntimeError: Connection reset by peer"       # the first line of its error
    assert watched(kill, seen, left=[0]).outcome().verdict == "hangs"
    assert watched(kill, {1: (0.0, "signal", "")}, fired=110.0).outcome().verdict == "watchdog only"
    done = {0: (3.0, "done", ""), 1: (3.0, "done", "")}
    assert watched(Plan("stall", 1, 2, 2.0), done).outcome().verdict == "rides out in 3 s"
    never = Watch(kill, 10.0).outcome()
    assert never.verdict == "not injected" and never.ranks == []


def test_an_injected_case_fails_saying_what_was_seen_and_a_hang_is_named():
    res = RankResult("PASS", phases={"dispatch": {"samples_us": [10.0, 2.5e6, 9.0]}})
    fault.judge(watched(Plan("stall", 1, 2, 2.0), {0: (3.0, "done", ""), 1: (3.0, "done", "")}), res)
    assert res.status == "FAIL" and res.fault.verdict == "rides out in 2.5 s"       # the stalled call's own time
    assert res.error.startswith("injected stall:1@2:2 (rank 1 stalled 2 s at its timed dispatch call 2): rides out")
    res = RankResult("FAIL", "ranks [0] did not finish")
    fault.judge(watched(Plan("kill", 1, 2), {1: (0.0, "signal", "")}, left=[0]), res)
    assert res.crash == "hang" and "hangs on a dead peer: rank(s) [0] still alive" in res.error
    waived = RankResult("WAIVED", "no widget")
    fault.judge(Watch(Plan("kill", 1, 2), 10.0), waived)
    assert (waived.status, waived.error) == ("WAIVED", "no widget")
    failed = RankResult("FAIL", "dispatch: rank 0 wrong")
    fault.judge(Watch(Plan("kill", 1, 2), 10.0), failed)
    assert failed.error == ("dispatch: rank 0 wrong; --inject kill:1@2 never fired: the run ended before the "
                            "fault's call")


def test_dispatch_inject_kill_is_a_fail_record_with_what_the_survivor_saw(run_tool, tmp_path):
    out = tmp_path / "r.jsonl"
    p = run_tool("moebench.dispatch", *TINY, "--iters", "3", "--inject", "kill:1@2", "--watchdog", "30",
                 "--out", str(out))
    assert p.returncode == 1, p.stdout + p.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["phase"], r["check"]["status"]) for r in recs] == [("dispatch", "FAIL"), ("combine", "FAIL")]
    f = recs[0]["fault"]
    assert f["verdict"].startswith("detects in") and f["after_s"] < 10 and f["left"] == [], f     # gloo: reset
    assert "Connection" in f["ranks"][0]["seen"] and f["ranks"][1]["ended"] == "killed"
    assert recs[0]["check"]["error"].startswith("injected kill:1@2 (rank 1 killed with SIGKILL at its timed dispatch")
    assert not any(alive(x["pid"]) for x in f["ranks"])
    assert "# FAIL alltoall: injected kill:1@2" in p.stdout
