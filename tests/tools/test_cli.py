"""The tools as a user drives them: bad input of every class is one line on stderr and exit 2 before any work;
an interrupt keeps what finished, says what did not run and leaves no process behind; a closed stdout drops
the output, not the work; first contact (`python -m moebench` lists the tools, the default output is
documented, README's examples say which need GPUs). What happens at the process's edges (signals, a closed
stdout, `python -m` itself) runs as subprocesses; the bad values, paths and files run each tool's main through
cli.run in this process (`run_tool`: the same code `python -m` runs, without starting torch again per case)."""
from pathlib import Path
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import FAKES, ROOT, alive, ranks_of, wait_for
from moebench import check, dispatch, megatron, permute, report
from moebench.env.toolkit import installed
from moebench.megatron.quick import loop


TINY = ["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--hidden", "64", "--num-experts", "8", "--topk", "2",
        "--iters", "1"]


def env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": f"{FAKES}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1", **extra}


def tool(*argv, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env(), cwd=kw.get("cwd", ROOT))


def one_line_exit2(p, *words):
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, (p.returncode, p.stderr[-3000:])
    assert all(w in err[0] for w in words), err[0]
    assert "Traceback" not in p.stderr
    return err[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A real (CPU, functional) dispatch JSONL."""
    out = tmp_path_factory.mktemp("good") / "good.jsonl"
    assert dispatch.main([*TINY, "--backend", "alltoall", "--out", str(out)]) == 0
    return out


# ---------------------------------------------------------------- values, at parse time, in every tool
VALUES = [
    (["moebench.dispatch", *TINY, "--seed", str(2**64)], "--seed"),
    (["moebench.dispatch", *TINY, "--seed", "-1"], "--seed"),
    (["moebench.dispatch", *TINY, "--num-sms", "0"], "--num-sms"),
    (["moebench.dispatch", *TINY, "--backend", "deepep", "--num-sms", "7"], "--num-sms"),
    (["moebench.dispatch", *TINY, "--knob", "mode=bogus"], "mode=bogus"),
    (["moebench.dispatch", *TINY, "--ceiling-gbps", "inf"], "--ceiling-gbps"),
    (["moebench.dispatch", *TINY, "--warmup-ms", "nan"], "--warmup-ms"),
    (["moebench.dispatch", *TINY, "--ranks-per-gpu", "0"], "--ranks-per-gpu"),
    (["moebench.dispatch", *TINY, "--timeout", "-1"], "--timeout"),
    (["moebench.check", "--threshold", "nan"], "--threshold"),
    (["moebench.check", "--timeout", "inf"], "--timeout"),
    (["moebench.check", "--ep", "0"], "--ep"),
    (["moebench.permute", "--iters", "0"], "--iters"),
    (["moebench.permute", "--seed", "-5"], "--seed"),
    (["moebench.report", "x.jsonl", "--min-effect", "1.5"], "--min-effect"),
    (["moebench.plan", "--ep", "8", "--nvlink-gbps", "0"], "--nvlink-gbps"),
    (["moebench.plan", "--ep", "8", "--net-gbps", "inf"], "--net-gbps"),
    (["moebench.plan", "--ep", "8", "--seed", str(2**63)], "--seed"),
    (["moebench.megatron", "flags", "--backend", "deepep", "--min-gain", "nan"], "--min-gain"),
    (["moebench.megatron", "flags", "--backend", "deepep", "--num-sms", "0"], "--num-sms"),
    (["moebench.megatron", "validate", "--dispatcher", "alltoall", "--steps", "1"], "--steps"),
    (["moebench.megatron", "validate", "--dispatcher", "alltoall", "--lr", "0"], "--lr"),
    (["moebench.megatron", "validate", "--dispatcher", "alltoall", "--ep", "0"], "--ep"),
]


@pytest.mark.parametrize("argv, flag", VALUES, ids=[f"{a[0].split('.')[-1]}{flag}" for a, flag in VALUES])
def test_out_of_range_values_are_one_line_exit_2(run_tool, argv, flag):
    one_line_exit2(run_tool(*argv), flag)


def test_a_version_outside_the_checked_range_gets_a_note(run_tool):
    p = run_tool("moebench.megatron", "flags", "--backend", "hybridep", "--megatron-core-version", "9.9.9")
    assert p.returncode == 0 and "outside the checked range" in p.stdout and "0.16.1 and 0.19.2" in p.stdout


# ---------------------------------------------------------------- output paths, before any work
def bad_outputs(tmp_path: Path) -> dict:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return {"empty": "", "directory": str(tmp_path), "under a file": str(blocker / "r.jsonl"),
            "unwritable": str(locked / "r.jsonl")}


OUTPUTS = [
    (["moebench.dispatch", *TINY, "--backend", "alltoall"], "--out"),
    (["moebench.check", "-t", "env"], "--out"),
    (["moebench.check", "-t", "env"], "--junit"),
    (["moebench.permute", "--ops-impl", "torch"], "--out"),
    (["moebench.permute", "--ops-impl", "torch"], "--plot"),
    (["moebench.megatron", "validate", "--dispatcher", "alltoall", "--device", "cpu"], "--out"),
]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_unwritable_folder_is_refused(run_tool, tmp_path):
    one_line_exit2(run_tool("moebench.dispatch", *TINY, "--out", bad_outputs(tmp_path)["unwritable"]), "--out")


@pytest.mark.parametrize("argv, flag", OUTPUTS, ids=[f"{a[0].split('.')[-1]}{f}" for a, f in OUTPUTS])
@pytest.mark.parametrize("kind", ["empty", "directory", "under a file"])
def test_bad_output_paths_are_refused_before_any_work(run_tool, tmp_path, argv, flag, kind):
    path = bad_outputs(tmp_path)[kind]
    before = sorted(tmp_path.rglob("*"))
    one_line_exit2(run_tool(*argv, flag, path), flag)
    assert sorted(tmp_path.rglob("*")) == before          # nothing written anywhere


def test_trace_output_must_be_a_folder(run_tool, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    one_line_exit2(run_tool("moebench.permute", "--ops-impl", "torch", "--trace", str(f)), "--trace", "not a directory")


def test_missing_output_folders_are_made(run_tool, tmp_path):
    out = tmp_path / "new" / "deeper" / "r.jsonl"
    p = run_tool("moebench.dispatch", *TINY, "--backend", "alltoall", "--out", str(out))
    assert p.returncode == 0 and len(out.read_text().splitlines()) == 2


# ---------------------------------------------------------------- offline inputs with no usable record
def inputs(tmp_path: Path) -> dict:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "garbage.jsonl").write_bytes(bytes(range(256)))
    (tmp_path / "other.jsonl").write_text('{"hello": 1}\n')
    return {k: str(tmp_path / f"{k}.jsonl") for k in ("empty", "garbage", "other")} | {"folder": str(tmp_path)}


@pytest.mark.parametrize("kind", ["empty", "garbage", "other", "folder"])
def test_offline_inputs_without_a_usable_record_are_errors_that_say_why(run_tool, tmp_path, good, kind):
    f = inputs(tmp_path)[kind]
    why = {"empty": "empty", "garbage": "no", "other": "not moebench.dispatch", "folder": "directory"}[kind]
    one_line_exit2(run_tool("moebench.report", f), f, why)
    one_line_exit2(run_tool("moebench.plan", "--ep", "8", "--results", f), "--results", why)
    one_line_exit2(run_tool("moebench.megatron", "flags", "--megatron-core-version", "0.19.2", "--results", f),
                   "--results")
    one_line_exit2(run_tool("moebench.check", "-t", "env", "--baseline", f), f)
    one_line_exit2(run_tool("moebench.report", "--compare", str(good), f), f)


def test_a_cpu_result_is_no_plan_input(run_tool, good):
    one_line_exit2(run_tool("moebench.plan", "--ep", "8", "--results", str(good)), "functional only")


# ---------------------------------------------------------------- trace files
def test_bad_trace_files_say_what_is_expected_and_what_was_found(run_tool, tmp_path):
    import numpy as np
    cases = {"empty.pt": b"", "json.pt": b'{"topk_idx": [[0, 1]]}', "junk.pt": bytes(range(200, 256)) * 3}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    np.savez(tmp_path / "none.npz")
    found = {"empty.pt": "an empty file", "json.pt": "JSON", "junk.pt": "neither a zip nor a pickle",
             "none.npz": "no arrays"}
    for name, what in found.items():
        msg = one_line_exit2(run_tool("moebench.dispatch", *TINY, "--routing", f"trace:{tmp_path / name}"), name)
        assert "expected a .pt file" in msg and "[N, K] or [W, T, K]" in msg and what in msg.split("; found ", 1)[1]


# ---------------------------------------------------------------- interrupts and a closed stdout
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
def test_an_interrupt_after_the_first_backend_keeps_its_records(tmp_path, sig, code):
    """alltoall finishes; deepep's (fake) buffer hangs in its constructor; the signal ends the run."""
    out = tmp_path / "r.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "moebench.dispatch", *TINY, "--backend", "alltoall,deepep",
                          "--out", str(out)], env=env(FAKE_DEEP_EP_CTOR="hang"), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 2, 180), "alltoall never finished"
        ranks = wait_for(lambda: (lambda k: k if len(k) >= 2 else None)(ranks_of(p.pid)), 60)
        assert ranks, "deepep's ranks never started"
        time.sleep(2.0)
        if sig == signal.SIGINT:
            os.killpg(p.pid, sig)            # Ctrl-C: the whole foreground group
        else:
            p.send_signal(sig)               # kill PID: the tool alone, which ends its ranks
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == code, err[-3000:]
    assert err.strip().splitlines() == [f"moebench.dispatch: interrupted by {sig.name}; 2 records of alltoall kept in "
                                        f"{out}; not run: deepep"], err[-3000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["backend"]["name"] for r in recs] == ["alltoall", "alltoall"]
    assert wait_for(lambda: not any(alive(k) for k in ranks), 20), "rank processes outlived the run"


@pytest.mark.slow
def test_a_closed_stdout_drops_the_output_not_the_work(tmp_path):
    out = tmp_path / "r.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "moebench.dispatch", *TINY, "--backend", "alltoall,deepep",
                          "--out", str(out)], env=env(FAKE_DEEP_EP_CTOR="sim"), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()                      # `| head -1`
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=240)
    assert p.returncode == 141, err[-3000:]  # 128 + SIGPIPE, as a writer whose reader went away
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-3000:]
    assert {json.loads(line)["backend"]["name"] for line in out.read_text().splitlines()} == {"alltoall", "deepep"}




def test_default_output_is_in_help_and_readme():
    assert "default:./moebench-dispatch.jsonl" in "".join(dispatch.parser().format_help().split())
    assert "default `./moebench-dispatch.jsonl`" in " ".join((ROOT / "README.md").read_text().split())


def test_python_m_moebench_lists_every_tool():
    p = subprocess.run([sys.executable, "-m", "moebench"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    for tool in ("dispatch", "permute", "check", "megatron", "report", "plan"):
        assert f"python -m moebench.{tool}" in p.stdout
        assert (ROOT / "moebench" / f"{tool}.py").is_file() or (ROOT / "moebench" / tool / "__main__.py").is_file()


def test_megatron_validate_offers_device_cpu_and_says_it_needs_a_gpu(capsys):
    assert megatron.main(["validate", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--device {auto,cuda,cpu}" in help_text and "needs GPUs" in help_text and "not a validation" in help_text
    with pytest.raises(SystemExit):
        megatron.parser().parse_args(["validate", "--dispatcher", "alltoall", "--cpu-functional"])
    capsys.readouterr()
    assert megatron.main(["validate", "--dispatcher", "hybridep", "--device", "cpu", "--ep", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("alltoall only" in err[0] if installed("megatron.core") else "megatron-core" in err[0])
    if not torch.cuda.is_available() and installed("megatron.core"):
        assert megatron.main(["validate", "--dispatcher", "alltoall"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs CUDA" in err[0] and "--device cpu" in err[0], err


def test_readme_examples_say_which_need_gpus():
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    blocks = text.split("```bash\n")[1:]
    commands = [line for b in blocks for line in b.split("```")[0].splitlines()
                if "python -m moebench" in line or line.startswith("torchrun")]
    assert len(commands) >= 15
    for line in commands:
        comment = line.partition("#")[2]
        assert "GPU" in comment or "anywhere" in comment, line


TINY = ["--device", "cpu", "--ep", "2", "--backend", "alltoall", "--num-tokens", "8", "--hidden", "64",
        "--num-experts", "8", "--topk", "2", "--iters", "1"]


def bad_paths(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    return {"proc": "/proc/moebench-x", "dir": str(tmp_path), "under_file": str(f / "out.jsonl")}


def one_line_exit2_in_process(rc, capsys, flag):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0], err
    return err[0]


@pytest.mark.parametrize("kind", ["proc", "dir", "under_file"])
def test_unwritable_outputs_are_refused_before_any_work(tmp_path, capsys, monkeypatch, kind):
    bad = bad_paths(tmp_path)[kind]
    monkeypatch.setattr(dispatch, "run_case", lambda *a, **k: pytest.fail("ran before checking --out"))
    one_line_exit2_in_process(dispatch.main([*TINY, "--out", bad]), capsys, "--out")
    monkeypatch.setattr(check.checks, "run", lambda *a, **k: pytest.fail("ran before checking --junit"))
    one_line_exit2_in_process(check.main(["-t", "env", "--junit", bad]), capsys, "--junit")
    one_line_exit2_in_process(check.main(["-t", "env", "--json", bad]), capsys, "--out")
    monkeypatch.setattr(permute, "bandwidths", lambda *a, **k: pytest.fail("ran before checking --plot"))
    one_line_exit2_in_process(permute.main(["--ops-impl", "torch", "--plot", bad]), capsys, "--plot")
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    one_line_exit2_in_process(report.main([str(rec), "--plot", bad]), capsys, "--plot")
    monkeypatch.setattr(loop, "run_training", lambda *a, **k: pytest.fail("ran before checking --out"))
    one_line_exit2_in_process(megatron.main(["validate", "--dispatcher", "alltoall", "--out", bad]), capsys, "--out")


def test_ranks_checking_one_output_at_once_both_find_it_writable(tmp_path, monkeypatch):
    """Under torchrun every rank checks --out: the file one rank's check made was removed by another's before
    its own removal, and `megatron arm` said "cannot write there (No such file or directory)"."""
    from moebench import cli
    out = tmp_path / "arms.jsonl"
    write = os.write

    def other_rank_done(fd, data):          # the other rank's check removes the file made for this one
        n = write(fd, data)
        out.unlink()
        return n
    monkeypatch.setattr(os, "write", other_rank_done)
    assert cli.output_problem(str(out), "--out") == "" and not out.exists()


def test_writable_output_check_leaves_no_file_and_keeps_contents(tmp_path):
    from moebench.cli import output_problem
    new = tmp_path / "sub" / "deeper" / "r.jsonl"
    assert output_problem(str(new), "--out") == "" and not (tmp_path / "sub").exists()
    old = tmp_path / "old.jsonl"
    old.write_text('{"a": 1}\n')
    assert output_problem(str(old), "--out") == "" and old.read_text() == '{"a": 1}\n'
    assert output_problem(str(tmp_path / "fresh.jsonl"), "--out") == "" and not (tmp_path / "fresh.jsonl").exists()


@pytest.mark.parametrize("extra, flag", [
    (["--routing", "zipf:nan"], "--routing"), (["--backend", ""], "--backend"), (["--iters", "-1"], "--iters"),
    (["--iters", "0"], "--iters"), (["--timeout", "0"], "--timeout"), (["--timeout", "-5"], "--timeout"),
    (["--warmup-ms", "-1"], "--warmup-ms"), (["--ceiling-gbps", "-3"], "--ceiling-gbps"),
])
def test_bad_run_options_are_one_line_exit_2(tmp_path, capsys, monkeypatch, extra, flag):
    monkeypatch.setattr(dispatch, "run_case", lambda *a, **k: pytest.fail("ran with a bad option"))
    argv = [a for a in TINY if a not in ("--backend", "alltoall")] + ["--backend", "alltoall"]
    one_line_exit2_in_process(dispatch.main([*argv, *extra, "--out", str(tmp_path / "r.jsonl")]), capsys, flag)


@pytest.mark.parametrize("line, key", [("num_tokens = 16.5", "num_tokens"), ("num_tokens = true", "num_tokens"),
                                       ('num_tokens = 16\nhidden = "abc"', "hidden")])
def test_bad_sweep_values_name_the_file_and_key(tmp_path, capsys, line, key):
    sw = tmp_path / "s.toml"
    body = "num_experts = 8\ntopk = 2\n" + line + ("\nhidden = 64" if "hidden" not in line else "")
    sw.write_text(body + "\n")
    msg = one_line_exit2_in_process(dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--out",
                                        str(tmp_path / "r.jsonl")]), capsys, key)
    assert str(sw) in msg


def test_sweep_max_cases_zero_is_refused(tmp_path, capsys):
    sw = tmp_path / "s.toml"
    sw.write_text("num_experts = 8\ntopk = 2\nnum_tokens = 16\nhidden = 64\n")
    one_line_exit2_in_process(dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--max-cases", "0",
                                  "--out", str(tmp_path / "r.jsonl")]), capsys, "--max-cases")


def test_the_parser_refuses_an_empty_value_of_any_option_and_argument(capsys):
    """`--sweep ''` ran the default case and exited 0: an empty value read as "not given" (issue 50). Every
    option, a subcommand's options and the positional arguments refuse it, except a flag whose tool refuses it
    in its own words (cli.own_empty)."""
    from moebench import cli
    p = cli.Parser(prog="python -m t")
    p.add_argument("--name")
    p.add_argument("--blank", default="")
    cli.own_empty(p.add_argument("--list"))
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("go")
    s.add_argument("files", nargs="+")
    assert p.parse_args(["--blank", "", "--list", ""]).list == ""
    for argv, what in ((["--name", ""], "t: error: --name is empty: give it a value, or leave it out"),
                       (["go", "a", ""], "t go: error: files is empty: give it a value")):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        assert e.value.code == 2 and capsys.readouterr().err == what + "\n"


def test_an_empty_file_or_name_is_refused_by_every_tool(run_tool, tmp_path):
    out = str(tmp_path / "r.jsonl")
    for prog, argv, flag in (
            ("moebench.dispatch", ["--sweep", "", "--device", "cpu", "--out", out], "--sweep"),
            ("moebench.report", [out, "--plot", ""], "--plot"),
            ("moebench.permute", ["--ops-impl", "torch", "--plot", ""], "--plot"),
            ("moebench.plan", ["--ep", "8", "--results", ""], "--results"),
            ("moebench.check", ["-t", "baseline", "--baseline", ""], "--baseline"),
            ("moebench.megatron validate", ["validate", "--megatron-lm", "", "--dispatcher", "deepep"],
             "--megatron-lm"),
            ("moebench.megatron compare", ["compare", ""], "files")):
        p = run_tool(prog.split()[0], *argv)
        assert p.returncode == 2 and p.stdout == ""
        assert p.stderr.splitlines() == [f"{prog}: error: {flag} is empty: give it a value"
                                         + (", or leave it out" if flag[0] == "-" else "")]
    assert not os.path.exists(out)


def test_an_error_naming_a_path_with_a_newline_is_one_line(run_tool, tmp_path):
    from moebench import cli
    odd = tmp_path / "new\nline"
    p = run_tool("moebench.report", str(odd / "r.jsonl"))
    assert p.returncode == 2 and p.stderr.splitlines() == [f"moebench.report: error: {tmp_path}/new\\nline/r.jsonl: "
                                                           "no such file"]
    assert cli.one_line("a\tb\x00c\u2028d\x1b[31me") == "a\\tb\\x00c\\u2028d\\x1b[31me"
    assert cli.one_line("caf\u00e9 \u65e5\u672c") == "caf\u00e9 \u65e5\u672c"          # text stays text


def test_an_output_path_ending_in_a_slash_names_a_folder(tmp_path, capsys):
    """`--out results/` wrote a file named `results` (the slash dropped on the way)."""
    out = str(tmp_path / "results") + "/"
    assert dispatch.main([*TINY, "--backend", "alltoall", "--out", out]) == 2
    assert capsys.readouterr().err.splitlines() == [f"moebench.dispatch: error: --out {out}: names a folder (it "
                                                    "ends in /): give a file name"]
    assert list(tmp_path.iterdir()) == []


def test_bad_trace_files_are_one_line(tmp_path, capsys):
    import torch
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 7)
    floats = tmp_path / "floats.pt"
    torch.save(torch.tensor([[0.0, 1.0], [2.0, 3.0]]), floats)
    for path, want in ((junk, "binary data that is neither a zip nor a pickle"), (floats, "must be integers")):
        msg = one_line_exit2_in_process(dispatch.main([*TINY, "--routing", f"trace:{path}", "--out",
                                            str(tmp_path / "r.jsonl")]), capsys, str(path))
        assert want in msg
