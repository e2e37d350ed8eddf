"""The failure classes issue 35 found open, driven as a new user drives the tools (subprocesses): launch
environments, output targets, sizes and times past the preflight, interrupts, nonsense accepted silently.
Every bad input is one line on stderr naming the problem and a non-zero exit (2 for usage), before any work:
never a traceback, never a hang (every run has a timeout), no record lost."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import FAKES, ROOT, proc_stats, ranks_of, wait_for
from moebench import cli
from moebench.env.toolkit import installed
from moebench.records import writer

TINY = ["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--hidden", "64", "--num-experts", "8", "--topk", "2",
        "--iters", "1"]
PERMUTE = ["moebench.permute", "--ops-impl", "torch", "--shapes", "16x32x2x4", "--iters", "1", "--ops", "permute"]
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS",
               "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "TRITON_INTERPRET")
HUGE = str(10**12)


def env(**extra) -> dict:
    """This environment without any launcher variable (the tests set their own), the fakes first on the path."""
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**clean, "PYTHONPATH": f"{FAKES}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1", **extra}


def tools(*runs, timeout=120) -> list[subprocess.CompletedProcess]:
    """`python -m` command lines (argv, or (argv, extra environment)), three at a time, results in order."""
    def one(run):
        argv, extra = run if isinstance(run, tuple) else (run, {})
        return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                              env=env(**extra), cwd=ROOT, stdin=subprocess.DEVNULL)
    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(one, runs))


def shell(line: str, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


def refused(p, *words, code=2) -> str:
    err = p.stderr.strip().splitlines()
    assert p.returncode == code and len(err) == 1, (p.args, p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    assert all(w in err[0] for w in words), (words, err[0])
    return err[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused_here(rc, capsys, *words) -> str:
    """The same as `refused`, for a tool's main() called in this process (cheap: torch is imported already)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, (rc, err)
    assert all(w in err[0] for w in words), (words, err[0])
    return err[0]


# ---------------------------------------------------------------- launch environments
LAUNCH = [({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, "SLURM_NTASKS=8"),
          ({"RANK": "0"}, "RANK=0"),
          ({"RANK": "0", "WORLD_SIZE": "abc", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "WORLD_SIZE='abc'"),
          ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "LOCAL_RANK=-1"),
          ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=3")]


@pytest.mark.parametrize("tool", ["dispatch", "check", "megatron"])
@pytest.mark.parametrize("launch, variable", LAUNCH, ids=[v for _, v in LAUNCH])
def test_launch_environments_are_refused_in_every_tool_that_starts_ranks(monkeypatch, capsys, tmp_path, tool, launch,
                                                                        variable):
    from moebench import check, dispatch, megatron
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in launch.items():
        monkeypatch.setenv(k, v)
    out = str(tmp_path / "r.jsonl")
    rc = {"dispatch": lambda: dispatch.main([*TINY, "--out", out]), "check": lambda: check.main(["-t", "env"]),
          "megatron": lambda: megatron.main(["validate", "--dispatcher", "alltoall", "--device", "cpu", "--out", out])}
    refused_here(rc[tool](), capsys, variable)
    assert list(tmp_path.iterdir()) == []


def test_launch_environments_from_the_command_line_busy_port_refused_and_a_whole_one_runs(tmp_path):
    out = tmp_path / "r.jsonl"
    dispatch = ["moebench.dispatch", *TINY[:3], "1", *TINY[4:], "--backend", "alltoall", "--out", str(out)]   # --ep 1
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        one = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
        alloc, port, whole = tools((dispatch, {"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}),
                                   (dispatch, {**one, "MASTER_PORT": str(busy.getsockname()[1])}),
                                   (dispatch, {**one, "MASTER_PORT": str(free_port())}))
    refused(alloc, "SLURM_NTASKS=8", "srun -n 8")
    refused(port, "MASTER_PORT", "in use")
    assert whole.returncode == 0, whole.stderr[-2000:]                   # torchrun's environment, one rank: it joins
    assert [json.loads(line)["check"]["status"] for line in out.read_text().splitlines()] == ["PASS", "PASS"]


# ---------------------------------------------------------------- output targets
def test_piped_stdout_and_symlinks_are_outputs(tmp_path):
    link, target = tmp_path / "link.jsonl", tmp_path / "later" / "target.jsonl"
    link.symlink_to(target)                                              # its target does not exist yet
    piped, linked = tools(["moebench.dispatch", *TINY, "--backend", "alltoall", "--out", "/dev/stdout"],
                          [*PERMUTE, "--out", str(link)])
    assert piped.returncode == 0, piped.stderr[-2000:]
    assert [json.loads(line)["phase"] for line in piped.stdout.splitlines()] == ["dispatch", "combine"]   # `| jq`
    assert "alltoall" in piped.stderr and "Traceback" not in piped.stderr                 # the table went aside
    assert linked.returncode == 0, linked.stderr[-2000:]
    assert link.is_symlink() and len(target.read_text().splitlines()) == 1


def test_dev_null_is_an_output_and_the_output_check_keeps_a_dangling_symlink(tmp_path, capsys):
    from moebench import permute
    assert permute.main([*PERMUTE[1:], "--out", os.devnull]) == 0      # fsync on a device was an OSError
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "target.jsonl")
    assert cli.output_problem(str(link), "--out") == ""
    assert link.is_symlink() and not (tmp_path / "target.jsonl").exists()
    with pytest.raises(cli.OutputError, match="/dev/full: cannot append 1 record"):   # one line, the tool exits 1
        writer.write_jsonl("/dev/full", [{"a": 1}])


def test_too_few_file_descriptors_are_one_line_before_any_rank_starts(tmp_path):
    """`ulimit -n 20`: hundreds of lines of c10d errors and a hang until the timeout, before (issue 50)."""
    out = tmp_path / "r.jsonl"
    py = f"{sys.executable} -m"
    runs = [shell(f"ulimit -n 20; {py} moebench.dispatch {' '.join(TINY)} --backend alltoall --out {out}"),
            shell(f"ulimit -n 20; {py} moebench.megatron validate --quick --dispatcher alltoall --device cpu --ep 2 "
                  f"--out {out}"),
            shell(f"ulimit -n 20; {py} moebench.check -t env"),
            shell(f"ulimit -n 20; {py} moebench.dispatch --sweep dsv3 {' '.join(TINY[:4])} --out {out}")]
    for p in runs:
        refused(p, "the open-file limit (ulimit -n) is 20: 2 ranks need about 40", "ulimit -n 1024")
    assert not out.exists()


def test_bad_output_targets_are_one_line_before_any_work(tmp_path, capsys):
    from moebench import check, dispatch, megatron, permute
    fifo, same = tmp_path / "fifo", str(tmp_path / "same")
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)      # were it opened after all, the open would not block the test
    try:
        refused_here(dispatch.main([*TINY, "--out", str(fifo)]), capsys, "FIFO", "/dev/stdout")
        refused_here(dispatch.main([*TINY, "--out", "/dev/full"]), capsys, "/dev/full", "No space left")
        refused_here(dispatch.main([*TINY, "--out", str(tmp_path / ("x" * 300))]), capsys, "File name too long")
        refused_here(permute.main([*PERMUTE[1:], "--out", same, "--plot", same]), capsys, "--out and --plot")
        refused_here(check.main(["-t", "env", "--out", same, "--junit", same]), capsys, "--out and --junit")
        refused_here(megatron.main(["compare", str(fifo), "--out", str(fifo)]), capsys, "FIFO")
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]
    fifo_cli, closed, full = (shell(f"python -m moebench.dispatch --out {fifo}"), shell("python -m moebench.plan >&-"),
                              shell("python -m moebench.plan >/dev/full"))
    refused(fifo_cli, "FIFO")                                            # it hung before any work
    refused(closed, "stdout is closed")
    refused(full, "stdout cannot be written", "No space left")


# ---------------------------------------------------------------- sizes and times past the preflight
SIZES = [(["--backend", "alltoall", "--num-tokens", HUGE], "host memory"),
         (["--num-experts", HUGE], "E=1000000000000"),                     # --backend all too
         (["--overlap", "gemm:1000000x1000000x1000000"], "GEMM"),
         (["--timeout", "1e300"], "--timeout"),
         (["--warmup-ms", "1e300"], "--warmup-ms")]


@pytest.mark.parametrize("extra, words", SIZES, ids=[" ".join(e)[:24] for e, _ in SIZES])
def test_sizes_and_times_past_the_preflight_are_refused_before_ranks_start(tmp_path, capsys, extra, words):
    from moebench import dispatch
    refused_here(dispatch.main([*TINY, "--out", str(tmp_path / "r.jsonl"), *extra]), capsys, words)
    assert list(tmp_path.iterdir()) == []


def test_sizes_past_memory_in_the_other_tools(capsys):
    from moebench import check, megatron, permute
    refused_here(permute.main(["--ops-impl", "torch", "--shapes", f"{HUGE}x128x4x8"]), capsys, "GiB", "lower T")
    refused_here(check.main(["--num-tokens", HUGE]), capsys, "host memory")
    refused_here(megatron.main(["validate", "--dispatcher", "alltoall", "--timeout", "1e300"]), capsys, "--timeout")
    if installed("megatron.core"):                   # the quick loop's model, counted before its ranks start
        refused_here(megatron.main(["validate", "--dispatcher", "alltoall", "--device", "cpu", "--hidden", "1048576",
                                    "--heads", "1", "--out", os.devnull]), capsys, "quick loop's model", "--hidden")
    refused(*tools(["moebench.plan", "--ep", "8", "--num-experts", HUGE]), "--num-experts must be at most 65536")


# ---------------------------------------------------------------- faults (--inject)
INJECT = [(["--inject", "kill:2@1"], ("--inject kill:2@1: rank 2 is past EP 2",)),
          (["--inject", "kill:1@2"], ("call 2 is past --iters 1",)),
          (["--inject", "kill:1"], ("--inject wants kill:RANK@CALL or stall:RANK@CALL:SECONDS",)),
          (["--inject", "stall:1@1"], ("--inject wants",)),
          (["--inject", "stall:1@1:0"], ("a stall lasts more than 0 s",)),
          (["--watchdog", "5"], ("--watchdog", "give --inject too"))]


@pytest.mark.parametrize("extra, words", INJECT, ids=[" ".join(e) for e, _ in INJECT])
def test_a_fault_this_run_cannot_take_is_one_line_before_any_work(tmp_path, capsys, extra, words):
    from moebench import dispatch
    refused_here(dispatch.main([*TINY, "--backend", "alltoall", "--out", str(tmp_path / "r.jsonl"), *extra]), capsys,
                 *words)
    assert list(tmp_path.iterdir()) == []


def test_a_fault_under_torchrun_is_refused_no_process_outside_the_job_would_watch(tmp_path, capsys, monkeypatch):
    from moebench import dispatch
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    refused_here(dispatch.main([*TINY, "--backend", "alltoall", "--out", str(tmp_path / "r.jsonl"), "--inject",
                                "kill:1@1"]), capsys, "not under torchrun/srun")


# ---------------------------------------------------------------- interrupts
def group_left(pgid: int) -> list[int]:
    """Processes of the group `pgid` still running (not zombies)."""
    return [p for p, fields in proc_stats() if int(fields[3]) == pgid and fields[0] != "Z"]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_a_tool_started_with_sigint_ignored_keeps_its_ranks_through_a_ctrl_c(tmp_path):
    """`tool &` in a script: the shell sets SIGINT to SIG_IGN; a Ctrl-C to the terminal's group must not end the
    ranks (they used to die, recording FAIL, which a resumed sweep then kept)."""
    out = tmp_path / "r.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "moebench.dispatch", *TINY, "--backend", "alltoall", "--views", "api",
                          "--warmup-ms", "1000", "--out", str(out)], env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        ranks = wait_for(lambda: (lambda k: k if len(k) >= 2 else None)(ranks_of(p.pid)), 60)
        assert ranks, "the ranks never started"
        for _ in range(2):                   # while the ranks start, then while they run
            time.sleep(1.0)
            os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err[-3000:]
    assert [json.loads(line)["check"]["status"] for line in out.read_text().splitlines()] == ["PASS", "PASS"]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("after_s", [0.3, 1.6], ids=["importing", "starting-ranks"])
def test_ctrl_c_during_start_up_is_one_line_130_and_no_orphan(tmp_path, after_s):
    p = subprocess.Popen([sys.executable, "-m", "moebench.dispatch", *TINY, "--backend", "alltoall", "--out",
                          str(tmp_path / "r.jsonl")], env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(after_s)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    if p.returncode == 0:
        pytest.skip("the run finished before the signal")
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[0].startswith("moebench.dispatch: interrupted by SIGINT"), err[-3000:]
    assert wait_for(lambda: not group_left(p.pid), 20), "processes outlived the tool"


# ---------------------------------------------------------------- nonsense accepted silently
def test_nonsense_is_refused_naming_the_problem(tmp_path, capsys, monkeypatch):
    from moebench import check, dispatch, megatron, permute
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)      # Triton on CPU only with its interpreter
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = str(tmp_path / "r.jsonl")
    d = [*TINY, "--backend", "alltoall", "--out", out]
    cases = [(lambda: dispatch.main([*d, "--views", ","]), ("--views names no view",)),
             (lambda: dispatch.main([*d, "--knob-sweep"]), ("--knob-sweep", "--sweep")),
             (lambda: dispatch.main([*d, "--max-cases", "3"]), ("--max-cases", "--sweep")),
             (lambda: dispatch.main([*d, "--ops-impl", "cuda"]), ("--ops-impl cuda", "CPU")),
             (lambda: dispatch.main([*d, "--ops-impl", "triton"]), ("--ops-impl triton", "TRITON_INTERPRET")),
             (lambda: dispatch.main([*d, "--routing", ""]), ("--routing is empty",)),
             (lambda: dispatch.main([*d, "--knob", "env:MOEBENCH_TRITON_PDL=2"]),      # read by the ranks alone
              ("MOEBENCH_TRITON_PDL=2: pdl must be 0 or 1, not 2",)),
             (lambda: dispatch.main([*d, "--routing", f"trace:{fifo}"]), ("found a FIFO",)),
             (lambda: dispatch.main(["--sweep", str(fifo), "--device", "cpu", "--out", out]), ("FIFO",)),
             (lambda: permute.main(["--ops-impl", "torch,torch"]), ("names torch twice",)),
             (lambda: permute.main(["--ops-impl", ""]), ("--ops-impl names no implementation",)),
             (lambda: permute.main(["--ops-impl", "torch", "--ops", ","]), ("--ops names no op",)),
             (lambda: permute.main(["--ops-impl", "torch,"]), ("--ops-impl 'torch,' has an empty implementation",)),
             (lambda: permute.main(["--ops-impl", "torch", "--shapes", "16x32x2x4,16x32x2x4"]),
              ("--shapes names 16x32x2x4 twice",)),
             (lambda: permute.main(["--ops-impl", "triton@garbage"]), ("triton@garbage", "integers separated by colons")),
             (lambda: permute.main(["--ops-impl", "torch", "--iters", HUGE]), ("--iters must be at most 100000",)),
             (lambda: dispatch.main([*d, "--views", "api,,graph"]), ("'api,,graph' has an empty view",)),
             (lambda: dispatch.main([*TINY, "--backend", "all,alltoall", "--out", out]), ("all names every backend",)),
             (lambda: dispatch.main([*d, "--iters", HUGE]), ("--iters must be at most 100000",)),
             (lambda: dispatch.main([*d, "--soak", HUGE]), ("--soak must be at most 1000000",)),
             (lambda: dispatch.main([*d, "--repeats", "0"]), ("--repeats must be >= 1, got 0",)),
             (lambda: dispatch.main([*d, "--soak-recreate", "2"]), ("--soak-recreate", "give --soak N too")),
             (lambda: check.main(["-t", "baseline", "--results", str(fifo)]), ("--results needs --baseline",)),
             (lambda: check.main(["-t", "env", "--soak", HUGE]), ("--soak must be at most 1000000",)),
             (lambda: megatron.main(["validate", "--dispatcher", "alltoall", "--iters", HUGE]),
              ("must be at most 100000",)),
             (lambda: permute.main(["--ops-impl", "torch@1"]), ("torch@1: torch has no variants",)),
             (lambda: permute.main(["--ops-impl", "torch", "--shapes", "16x32x2x4,016x32x2x4"]),
              ("--shapes names 16x32x2x4 twice",)),
             (lambda: permute.main(["--ops-impl", "megatron@"]), ("megatron@: megatron has no variants",)),
             (lambda: permute.main(["--ops-impl", "torch", "--shapes", ""]), ("--shapes",)),
             (lambda: check.main(["-p", ""]), ("-p is empty",)),
             (lambda: megatron.main(["validate", "--dispatcher", "deepep,deepep"]), ("names deepep twice",)),
             (lambda: megatron.main(["compare", str(tmp_path / "missing.jsonl")]), ("missing.jsonl: no such file",)),
             (lambda: megatron.main(["compare", str(fifo)]), ("FIFO",))]
    if not torch.cuda.is_available():                # a machine without GPUs cannot run moebench's CUDA kernels
        cases.append((lambda: permute.main(["--ops-impl", "torch,cuda"]), ("--ops-impl cuda", "cannot run")))
    for main, words in cases:
        refused_here(main(), capsys, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]
    unknown, baseline = tools(["moebench", "bogus"], ["moebench.check", "-t", "baseline", "--baseline", str(fifo)],
                              timeout=60)
    refused(unknown, "unknown tool 'bogus'", "dispatch, permute, check")
    refused(baseline, "--baseline", "FIFO")                              # it hung reading the FIFO


# ---------------------------------------------------------------- the second held-out pass (issue 35)
def test_a_rank_of_a_job_whose_other_ranks_never_start_is_one_line_bounded_and_stops_on_ctrl_c(tmp_path):
    """torchrun's variables, whole, in a shell with no other rank: the rendezvous waited in C++ for ever,
    deaf to Ctrl-C and SIGTERM; now it says what it waits for, gives up after --timeout, and stops on a signal."""
    job = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    d = ["moebench.dispatch", *TINY, "--backend", "alltoall", "--out", str(tmp_path / "r.jsonl")]
    alone, = tools((d + ["--timeout", "2"], {**job, "MASTER_PORT": str(free_port())}), timeout=60)
    refused(alone, "only 1 of 2 ranks joined at 127.0.0.1:", "within 2 s (--timeout)", "unset RANK")
    p = subprocess.Popen([sys.executable, "-m", *d], env=env(**job, MASTER_PORT=str(free_port())), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(9)                                       # past start-up and the join's first words (5 s in)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert "waiting for the job's other ranks" in err and "interrupted by SIGINT" in err.splitlines()[-1], err
    assert not (tmp_path / "r.jsonl").exists()


def test_a_whole_job_of_two_ranks_started_apart_joins_and_runs(tmp_path):
    out, port = tmp_path / "r.jsonl", str(free_port())
    d = ["moebench.dispatch", *TINY, "--backend", "alltoall", "--out", str(out)]
    job = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    later = subprocess.Popen([sys.executable, "-m", *d], env=env(**job, RANK="1", LOCAL_RANK="1"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)                                        # rank 1 first: it waits for rank 0's store
        lead, = tools((d, {**job, "RANK": "0", "LOCAL_RANK": "0"}), timeout=120)
        _, err1 = later.communicate(timeout=60)
    finally:
        if later.poll() is None:
            later.kill()
    assert lead.returncode == 0 and later.returncode == 0, (lead.stderr[-2000:], err1[-2000:])
    assert err1 == "" and "Traceback" not in lead.stderr          # rank 1 is quiet: no C++ connect traces
    assert [json.loads(line)["check"]["status"] for line in out.read_text().splitlines()] == ["PASS", "PASS"]


def test_second_pass_inputs_across_the_tools(tmp_path):
    """A sweep none of whose cases fits, the same input twice for a verdict, a plot into a folder not made yet."""
    huge = tmp_path / "huge.toml"
    huge.write_text("hidden = 100000000\nnum_experts = 8\ntopk = 2\nnum_tokens = [100000000]\n")
    bad_dtype = tmp_path / "dtype.toml"
    bad_dtype.write_text('hidden = 64\nnum_experts = 8\ntopk = 2\nnum_tokens = [8]\ndtype = ["int3"]\n')
    rows = tmp_path / "r.jsonl"
    sweep = ["moebench.dispatch", "--device", "cpu", "--ep", "2", "--iters", "1", "--backend", "alltoall"]
    plot = tmp_path / "not" / "yet" / "p.png"
    none_fit, dtype, same_backend, same_file, twice, plotted = tools(
        [*sweep, "--sweep", str(huge), "--out", str(rows)], [*sweep, "--sweep", str(bad_dtype), "--out", str(rows)],
        ["moebench.report", "--compare", "alltoall", "alltoall", str(rows)],
        ["moebench.report", "--compare", str(rows), str(tmp_path / ".." / tmp_path.name / "r.jsonl")],
        ["moebench.report", str(rows), str(rows)], [*PERMUTE, "--plot", str(plot)])
    assert none_fit.returncode == 2 and "refused 1" in none_fit.stdout, none_fit.stdout[-2000:]
    assert none_fit.stderr.strip().startswith("# REFUSED 1 case(s)") and "GiB" in none_fit.stderr
    refused(dtype, "sweep dtype: dtype must be one of bf16, fp8, got 'int3'")
    refused(same_backend, "the same backend on both sides")
    refused(same_file, "(the same file as", "is given twice")
    refused(twice, "is given twice: its records would count twice")
    assert plotted.returncode == 0 and plot.is_file(), plotted.stderr[-2000:]


def test_a_job_rank_that_dies_mid_run_is_a_fail_record_and_only_rank_0_writes(tmp_path):
    """A torchrun job: rank 1 stopped mid-run left rank 0 with a gloo traceback and no record; rank 1 appended the
    job's WAIVED records a second time. Now rank 0 records FAIL naming why, and only rank 0 writes."""
    out, port = tmp_path / "r.jsonl", str(free_port())
    d = ["moebench.dispatch", *TINY[:-1], "100000", "--backend", "alltoall,mcore-alltoall", "--timeout", "30",
         "--views", "api", "--out", str(out)]
    job = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    one = subprocess.Popen([sys.executable, "-m", *d], env=env(**job, RANK="1", LOCAL_RANK="1"), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        zero = subprocess.Popen([sys.executable, "-m", *d], env=env(**job, RANK="0", LOCAL_RANK="0"), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(12)                                    # both joined and timing 100000 iterations
        os.killpg(one.pid, signal.SIGINT)
        _, err0 = zero.communicate(timeout=90)
        one.communicate(timeout=30)
    finally:
        for p in (one, zero):
            if p.poll() is None:
                p.kill()
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert zero.returncode == 1 and "Traceback" not in err0, err0[-2000:]
    assert sorted((r["backend"]["name"], r["check"]["status"]) for r in recs) == [
        ("alltoall", "FAIL"), ("alltoall", "FAIL"), ("mcore-alltoall", "WAIVED"), ("mcore-alltoall", "WAIVED")]
    assert "rank 0 of the job" in recs[-1]["check"]["error"] or "rank 0 of the job" in recs[0]["check"]["error"]


def test_a_joined_sweep_runs_what_rank_0_has_not_done_whatever_the_other_ranks_files_hold(tmp_path):
    """Each node resuming from its own --out: the ranks chose different cases and rank 1 died in a traceback."""
    sweep = tmp_path / "tiny.toml"
    sweep.write_text("hidden = 64\nnum_experts = 8\ntopk = 2\nnum_tokens = [8, 16]\n")
    mine, theirs = tmp_path / "rank0.jsonl", tmp_path / "rank1.jsonl"
    s = ["moebench.dispatch", "--device", "cpu", "--ep", "2", "--iters", "1", "--backend", "alltoall", "--timeout",
         "60", "--sweep", str(sweep)]
    for _ in range(2):                                   # the first run fills rank 0's file; the second resumes it
        job = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        one = subprocess.Popen([sys.executable, "-m", *s, "--out", str(theirs)], env=env(**job, RANK="1",
                               LOCAL_RANK="1"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        zero, = tools(([*s, "--out", str(mine)], {**job, "RANK": "0", "LOCAL_RANK": "0"}))
        _, err1 = one.communicate(timeout=60)
        assert zero.returncode == 0 and one.returncode == 0, (zero.stderr[-2000:], err1[-2000:])
    assert "ran 0, skipped 2" in zero.stdout and len(mine.read_text().splitlines()) == 4
    assert not theirs.exists()                           # rank 1 writes nothing: the job's records are rank 0's
