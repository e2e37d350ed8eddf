"""Launching ranks: local ranks from one rank server and torchrun/srun, rank failures named, dying with the
parent, signals, backends that cannot take a shape."""
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from conftest import SMALL, alive, children_of, fake_env, ranks_of, wait_for
from moebench.harness import launch
from moebench.harness.launch import LaunchError, run_ranks
from moebench.records.reader import read_objects as read_records


def sum_ranks(ctx):
    t = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def raise_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()          # the others wait for rank 1, which never comes
    return ctx.rank


def segfault_on_rank0(ctx):
    if ctx.rank == 0:
        ctypes.string_at(0)
    dist.barrier()


def hang(ctx):
    time.sleep(60)


def test_ranks_run_and_return_in_order():
    assert run_ranks(sum_ranks, 3, "cpu", timeout_s=60) == [6.0, 6.0, 6.0]


def tagged(ctx):
    """This rank's parent and the tag of its launch's environment, said on its stdout."""
    tag = os.environ.get("MOEBENCH_TEST_TAG")
    os.write(1, f"rank {ctx.rank} {tag}\n".encode())          # one write: the ranks' lines never interleave
    return os.getppid(), tag


def test_ranks_are_forked_from_one_server_with_the_environment_and_stdout_of_their_launch(tmp_path, monkeypatch):
    """Every launch of this process forks its ranks from the one rank server (started once, torch imported once),
    and each rank sees the environment and stdout of its own launch, not of the server's start."""
    monkeypatch.setenv("MOEBENCH_TEST_TAG", "first")
    first = run_ranks(tagged, 2, "cpu", timeout_s=60)
    monkeypatch.setenv("MOEBENCH_TEST_TAG", "second")
    out, saved = tmp_path / "stdout.txt", os.dup(1)
    with open(out, "w") as f:
        sys.stdout.flush()
        os.dup2(f.fileno(), 1)
        try:
            second = run_ranks(tagged, 2, "cpu", timeout_s=60)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    assert [tag for _, tag in first] == ["first"] * 2 and [tag for _, tag in second] == ["second"] * 2
    servers = {parent for parent, _ in first + second}
    assert len(servers) == 1 and os.getpid() not in servers and alive(servers.pop())
    assert sorted(out.read_text().splitlines()) == ["rank 0 second", "rank 1 second"]


def port_holder(ctx):
    """The pid that listens on this rank's MASTER_PORT (Linux /proc)."""
    port = int(os.environ["MASTER_PORT"])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":          # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:
            continue
    return None


@pytest.mark.skipif(not os.path.isfile("/proc/net/tcp"), reason="reads the listening sockets from /proc")
def test_the_launching_process_holds_the_ranks_store_on_a_port_the_kernel_gave_it():
    """No port is probed free and listened on later by rank 0 (taken in between: EADDRINUSE, seen with eight
    launches side by side on the GPU machine)."""
    assert run_ranks(port_holder, 2, "cpu", timeout_s=60) == [os.getpid()] * 2


def test_a_rank_that_raises_fails_the_run_quickly():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1 failed: ValueError: boom on purpose"):
        run_ranks(raise_on_rank1, 2, "cpu", timeout_s=60)
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_a_rank_that_crashes_is_named_with_its_signal(monkeypatch):
    """...as soon as the rank that lost it has reported: the grace for the others' reports ends when none is left."""
    monkeypatch.setattr(launch, "GRACE_S", 60.0)
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="rank 0 died.*SIGSEGV.*rank 1 failed"):
        run_ranks(segfault_on_rank0, 2, "cpu", timeout_s=60)
    assert time.monotonic() - t0 < 30


def abort_inside_native_output(ctx):
    """A library that aborts on a C assert (its message written to the unbuffered stderr by __assert_fail, then
    SIGABRT), as NCCL EP does on misuse, while a backend listens to its native output."""
    from moebench.backends.nccl_family import native_output
    with native_output("first dispatch"):
        if ctx.rank == 0:
            os.write(2, b"nccl_ep.cc:1684: ncclEpCreateGroup: Assertion `max_dispatch_tokens_per_rank > 0' failed.\n")
            os.abort()
        time.sleep(60)


@pytest.mark.slow
def test_a_rank_that_aborts_in_a_native_call_is_named_with_the_librarys_last_lines():
    with pytest.raises(LaunchError, match=r"rank 0 died.*SIGABRT.*its last lines: nccl_ep.cc:1684: "
                                          r"ncclEpCreateGroup: Assertion `max_dispatch_tokens_per_rank > 0' failed"):
        run_ranks(abort_inside_native_output, 2, "cpu", timeout_s=60)


@pytest.mark.slow
def test_a_hang_ends_at_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish within 3 s"):
        run_ranks(hang, 2, "cpu", timeout_s=3)
    assert time.monotonic() - t0 < 20


@pytest.mark.slow
def test_backend_all_waives_what_cannot_take_the_shape(tmp_path):
    """deep_ep importable (the fake), --hidden 100: deepep and deepep-ll are WAIVED with the reason, exit 0."""
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", *SMALL, "--hidden", "100", "--backend", "all",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=fake_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    recs = {r["backend"]["name"]: r for r in read_records(out)}
    for name in ("deepep", "deepep-ll", "hybridep"):
        assert recs[name]["check"]["status"] == "WAIVED", recs[name]["check"]
        assert "--hidden" in recs[name]["check"]["error"]
    assert recs["alltoall"]["check"]["status"] == "PASS"


NAP = """
import sys, time
from moebench.harness.launch import run_ranks

def nap(ctx):
    time.sleep(120)

if __name__ == "__main__":
    run_ranks(nap, 2, "cpu", 300.0)
"""


@pytest.mark.slow
def test_ranks_die_with_a_sigkilled_parent(tmp_path):
    script = tmp_path / "nap.py"
    script.write_text(NAP)
    p = subprocess.Popen([sys.executable, str(script)], env=fake_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        kids = wait_for(lambda: (lambda k: k if len(k) >= 2 else None)(ranks_of(p.pid)), 60)
        assert kids and len(kids) == 2, ranks_of(p.pid)
        kids += children_of(p.pid)                         # the rank server and the resource tracker too
        time.sleep(1.0)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_for(lambda: not any(alive(k) for k in kids), 20), [k for k in kids if alive(k)]
    finally:
        for k in children_of(p.pid):
            os.kill(k, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_ends_a_run_with_one_line_and_no_orphans(tmp_path):
    p = subprocess.Popen([sys.executable, "-u", "-m", "moebench.dispatch", *SMALL[:-2], "--iters", "100000",
                          "--hidden", "64", "--backend", "alltoall", "--out", str(tmp_path / "r.jsonl")],
                         env=fake_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kids = wait_for(lambda: (lambda k: k if len(k) >= 2 else None)(ranks_of(p.pid)), 60)
    assert kids, "no rank processes started"
    time.sleep(3.0)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err[-2000:]                   # 128 + SIGTERM
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == [f"moebench.dispatch: interrupted by SIGTERM; 0 records of no backend kept in "
                                        f"{tmp_path / 'r.jsonl'}; not run: alltoall"], err
    assert wait_for(lambda: not any(alive(k) for k in kids), 20)


def test_a_job_whose_port_is_taken_is_one_line_not_a_traceback(monkeypatch):
    """The port checked free by launcher.problem() and taken before rank 0 listens: JoinError, said once."""
    from moebench.harness import join
    monkeypatch.setattr(join, "_store", None)
    monkeypatch.setattr(join, "_failed", "")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        why = join.join(0, 2, 5.0)
    assert why.startswith("rank 0 cannot listen on MASTER_PORT=") and "free port" in why
    with pytest.raises(join.JoinError, match="cannot listen"):       # later groups fail at once, not again
        join.group_store(0, 2, 5.0)
