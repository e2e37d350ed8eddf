"""Issue 13, item 13: report's tables say when a row is the last of several runs, --compare says it
pools every run, and functional-only records left out of a verdict are named in its output."""
import json

from test_report import noisy, rec

from moebench import report


def write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_tables_mark_the_last_of_repeated_runs(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    write(f, [rec("deepep", 1024, "dispatch", median=200.0), rec("deepep", 1024, "dispatch", median=100.0),
              rec("deepep", 2048, "dispatch", median=300.0)])
    assert report.main([str(f)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in ("1024", "2048")}
    assert " 100 " in rows["1024"] and "200" not in rows["1024"] and "[last of 2 runs]" in rows["1024"]
    assert "last of" not in rows["2048"]
    assert report.REPEATS_NOTE in out and "--compare pools" in out
    assert report.main([str(f), "--json"]) == 0
    assert all("_runs" not in r for r in json.loads(capsys.readouterr().out))


def test_compare_says_it_pools_and_names_the_functional_records_left_out(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    cpu = dict(rec("deepep", 512, "dispatch", samples=noisy(50.0, seed=9)), device="cpu", functional=True)
    write(a, [rec("deepep", 1024, "dispatch", samples=noisy(100.0, seed=1)), cpu])
    write(b, [rec("deepep", 1024, "dispatch", samples=noisy(80.0, seed=2)),
              rec("deepep", 1024, "dispatch", samples=noisy(82.0, seed=3)), cpu])
    assert report.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    verdicts = [line for line in out.splitlines() if "faster" in line or "slower" in line or "within noise" in line]
    assert any(" 1024 " in v for v in verdicts) and not any(" 512 " in v for v in verdicts)
    assert "pools every run" in out
    assert "left out 2 record(s) that are functional only" in out
    assert report.main(["--compare", str(a), str(b), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["left_out_functional"] == 2 and len(res["rows"]) == 1
