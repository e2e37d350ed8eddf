"""Issue 13, bad input: every bad flag or file is one line naming it, exit 2, before any work."""
import pytest

from moebench import check, dispatch, megatron, permute, report

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
    monkeypatch.setattr(megatron, "run_training", lambda *a, **k: pytest.fail("ran before checking --out"))
    one_line_exit2(megatron.main(["validate", "--dispatcher", "alltoall", "--out", bad]), capsys, "--out")


def test_writable_output_check_leaves_no_file_and_keeps_contents(tmp_path):
    from moebench.cli import output_problem
    new = tmp_path / "sub" / "deeper" / "r.jsonl"
    assert output_problem(str(new), "--out") == "" and not (tmp_path / "sub").exists()
    old = tmp_path / "old.jsonl"
    old.write_text('{"a": 1}\n')
    assert output_problem(str(old), "--out") == "" and old.read_text() == '{"a": 1}\n'
    assert output_problem(str(tmp_path / "fresh.jsonl"), "--out") == "" and not (tmp_path / "fresh.jsonl").exists()
