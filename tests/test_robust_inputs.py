"""Issue 13, bad input: every bad flag or file is one line naming it, exit 2, before any work."""
import pytest

from moebench import check, dispatch, megatron, permute, report
from moebench.megatron import tool

TINY = ["--device", "cpu", "--ep", "2", "--backend", "alltoall", "--num-tokens", "8", "--hidden", "64",
        "--num-experts", "8", "--topk", "2", "--iters", "1"]


def bad_paths(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    return {"proc": "/proc/moebench-x", "dir": str(tmp_path), "under_file": str(f / "out.jsonl")}


def one_line_exit2(rc, capsys, flag):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0], err
    return err[0]


@pytest.mark.parametrize("kind", ["proc", "dir", "under_file"])
def test_unwritable_outputs_are_refused_before_any_work(tmp_path, capsys, monkeypatch, kind):
    bad = bad_paths(tmp_path)[kind]
    monkeypatch.setattr(dispatch, "run_case", lambda *a, **k: pytest.fail("ran before checking --out"))
    one_line_exit2(dispatch.main([*TINY, "--out", bad]), capsys, "--out")
    monkeypatch.setattr(check.checks, "run", lambda *a, **k: pytest.fail("ran before checking --junit"))
    one_line_exit2(check.main(["-t", "env", "--junit", bad]), capsys, "--junit")
    one_line_exit2(check.main(["-t", "env", "--json", bad]), capsys, "--out")
    monkeypatch.setattr(permute, "bandwidths", lambda *a, **k: pytest.fail("ran before checking --plot"))
    one_line_exit2(permute.main(["--ops-impl", "torch", "--plot", bad]), capsys, "--plot")
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    one_line_exit2(report.main([str(rec), "--plot", bad]), capsys, "--plot")
    monkeypatch.setattr(tool, "run_training", lambda *a, **k: pytest.fail("ran before checking --out"))
    one_line_exit2(megatron.main(["validate", "--dispatcher", "alltoall", "--out", bad]), capsys, "--out")


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
    one_line_exit2(dispatch.main([*argv, *extra, "--out", str(tmp_path / "r.jsonl")]), capsys, flag)


@pytest.mark.parametrize("line, key", [("num_tokens = 16.5", "num_tokens"), ("num_tokens = true", "num_tokens"),
                                       ('num_tokens = 16\nhidden = "abc"', "hidden")])
def test_bad_sweep_values_name_the_file_and_key(tmp_path, capsys, line, key):
    sw = tmp_path / "s.toml"
    body = "num_experts = 8\ntopk = 2\n" + line + ("\nhidden = 64" if "hidden" not in line else "")
    sw.write_text(body + "\n")
    msg = one_line_exit2(dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--out",
                                        str(tmp_path / "r.jsonl")]), capsys, key)
    assert str(sw) in msg


def test_sweep_max_cases_zero_is_refused(tmp_path, capsys):
    sw = tmp_path / "s.toml"
    sw.write_text("num_experts = 8\ntopk = 2\nnum_tokens = 16\nhidden = 64\n")
    one_line_exit2(dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--max-cases", "0",
                                  "--out", str(tmp_path / "r.jsonl")]), capsys, "--max-cases")


def test_bad_trace_files_are_one_line(tmp_path, capsys):
    import torch
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 7)
    floats = tmp_path / "floats.pt"
    torch.save(torch.tensor([[0.0, 1.0], [2.0, 3.0]]), floats)
    for path, want in ((junk, "binary data that is neither a zip nor a pickle"), (floats, "must be integers")):
        msg = one_line_exit2(dispatch.main([*TINY, "--routing", f"trace:{path}", "--out",
                                            str(tmp_path / "r.jsonl")]), capsys, str(path))
        assert want in msg
