"""The launcher environment, read once for every tool (env/launcher.py): a whole torchrun or srun job joins,
a plain machine starts its own ranks, and anything in between is one line naming the variable."""
import socket

import pytest

from moebench.env import launcher

MASTER = {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}       # an address that resolves anywhere
SRUN = {"SLURM_NTASKS": "8", "SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_STEP_ID": "0", **MASTER}

JOINS = [
    ({}, None),
    ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, None),            # one task starts its ranks itself
    ({"SLURM_PROCID": "0"}, None),                                 # a batch shell without a task count
    ({"MASTER_PORT": "1"}, None),                                  # local ranks pick their own port
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", **MASTER}, (1, 2, 1)),
    (SRUN, (3, 8, 3)),
]

REFUSED = [
    ({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, "SLURM_NTASKS=8", "srun -n 8"),
    ({**SRUN, "SLURM_STEP_ID": "4294967291"}, "SLURM_STEP_ID=4294967291", "srun"),     # the batch step
    ({**SRUN, "SLURM_PROCID": "8"}, "SLURM_PROCID=8", "below the 8 tasks"),
    ({**SRUN, "MASTER_ADDR": ""}, "MASTER_ADDR", "export"),
    ({"RANK": "0"}, "RANK=0", "without WORLD_SIZE"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK=0", "unset LOCAL_RANK"),
    ({"RANK": "0", "WORLD_SIZE": "abc", **MASTER}, "WORLD_SIZE='abc'", "not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1", **MASTER}, "LOCAL_RANK=-1", ">= 0"),
    ({"RANK": "2", "WORLD_SIZE": "2", **MASTER}, "RANK=2", "below WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR", "torchrun"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT=70000", "1-65535"),
]


@pytest.mark.parametrize("env, want", JOINS)
def test_whole_launcher_jobs_join_and_plain_machines_do_not(env, want):
    assert launcher.problem(env) == "" and launcher.joined(env) == want


def test_a_master_address_that_does_not_resolve_is_named_on_every_rank():
    """Rank 0 blamed the port after 60 lines of C++ traces; rank 1 counted 0 joined for --timeout."""
    for rank in ("0", "1"):
        line = launcher.problem({**MASTER, "RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid"})
        assert line.startswith("MASTER_ADDR='no-such-host.invalid' does not resolve") and "\n" not in line, line


@pytest.mark.parametrize("env, variable, what", REFUSED, ids=[r[1] for r in REFUSED])
def test_partial_garbled_or_unlaunched_environments_name_the_variable(env, variable, what):
    line = launcher.problem(env)
    assert variable in line and what in line and "\n" not in line, line
    with pytest.raises(launcher.LaunchEnvError):
        launcher.joined(env)


def test_a_busy_master_port_is_refused_on_rank_0_only():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(s.getsockname()[1])}
        assert "in use" in launcher.problem(env) and "MASTER_PORT" in launcher.problem(env)
        assert launcher.problem({**env, "RANK": "1"}) == ""                                  # rank 0 listens there
        assert launcher.problem({**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}) == ""       # torchrun's agent does


def test_shape_names_the_launcher_and_its_ranks_per_node():
    assert launcher.shape({**SRUN, "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8(x2)"}) == (16, 8, "srun")
    assert launcher.shape({"RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", **MASTER}) == (16, 8, "torchrun")
    assert launcher.shape({}) is None


def test_a_low_open_file_limit_is_raised_to_the_hard_one_or_refused(monkeypatch):
    """At `ulimit -n 20` a run printed hundreds of lines of c10d errors and hung (issue 50); the limit is
    checked before any rank starts: a soft limit below the need is raised where the hard one allows it."""
    import resource

    from moebench.env import limits
    calls = []
    monkeypatch.setattr(resource, "setrlimit", lambda what, lim: calls.append(lim))
    monkeypatch.setattr(resource, "getrlimit", lambda what: (20, 4096))
    assert limits.open_files_problem(8) == "" and calls == [(4096, 4096)]
    monkeypatch.setattr(resource, "getrlimit", lambda what: (20, 20))
    assert limits.open_files_problem(8) == ("the open-file limit (ulimit -n) is 20: 8 ranks need about 64 files and "
                                            "sockets; raise it (ulimit -n 1024) and run again")
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 1024))
    assert limits.open_files_problem(8) == "" and len(calls) == 1
    assert limits.open_files_needed(16) > 56          # measured: EP 16 needed 56 (limits.py)
