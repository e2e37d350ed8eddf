"""The regression gate: row identity, comparison, and the CLI with --baseline."""
import json

from moebench import check
from moebench.checks import baseline

W = {"num_tokens": 4096, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16",
     "routing": "uniform", "seed": 0, "gpus_per_node": 8}


def rec(name, phase, algbw, status="PASS", mode=None, timed=True):
    return {"schema": "moebench.result/1", "workload": W, "phase": phase,
            "backend": {"name": name, "knobs": {"mode": mode} if mode else {}},
            "timing": {"median_us": 100.0} if timed else None, "traffic": {"algbw_GBps": algbw, "busbw_GBps": 1.0},
            "check": {"status": status, "error": None}}


def test_rows_from_records_identity():
    rows = baseline.rows_from_records([rec("deepep", "dispatch", 300.0), rec("hybridep", "combine", 250.0, mode="plain"),
                                       rec("alltoall", "dispatch", 9.0, status="FAIL"), rec("x", "dispatch", 1.0, timed=False)])
    assert [baseline.row_key(r) for r in rows] == [
        "T4096 H7168 E256 K8 EP8 bf16 uniform seed0 gpn8 | deepep | dispatch",
        "T4096 H7168 E256 K8 EP8 bf16 uniform seed0 gpn8 | hybridep/plain | combine"]
    assert rows[0]["GBps"] == 300.0


def test_compare_threshold():
    b = [{"workload": "p2p", "backend": "sm-copy", "phase": "0->1", "GBps": 400.0},
         {"workload": "p2p", "backend": "sm-copy", "phase": "1->0", "GBps": 400.0},
         {"workload": "gone", "backend": "x", "phase": "y", "GBps": 1.0}]
    c = [{"workload": "p2p", "backend": "sm-copy", "phase": "0->1", "GBps": 350.0},
         {"workload": "p2p", "backend": "sm-copy", "phase": "1->0", "GBps": 380.0}]
    r = baseline.compare(b, c, 10.0)
    assert [i["row"] for i in r["regressions"]] == ["p2p | sm-copy | 0->1"]
    assert r["regressions"][0]["change_pct"] == -12.5 and r["only_baseline"] == ["gone | x | y"]
    assert baseline.compare(b, c, 15.0)["regressions"] == []
    assert "400.0 -> 350.0 GB/s (-12.5%)" in baseline.describe(r["regressions"][0])


def _write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_cli_gate_on_dispatch_results(tmp_path, capsys):
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    _write_jsonl(old, [rec("deepep", "dispatch", 300.0), rec("deepep", "combine", 280.0)])
    _write_jsonl(new, [rec("deepep", "dispatch", 240.0), rec("deepep", "combine", 279.0)])
    out = tmp_path / "r.json"
    rc = check.main(["-t", "baseline", "--baseline", str(old), "--results", str(new), "--json", str(out)])
    assert rc == 1
    res = json.loads(out.read_text())["results"][0]
    assert res["status"] == "FAIL" and "deepep | dispatch: 300.0 -> 240.0 GB/s (-20.0%)" in res["summary"]
    assert "combine" not in res["summary"]
    assert check.main(["-t", "baseline", "--baseline", str(old), "--results", str(new), "--threshold", "25"]) == 0
    # the report itself is a valid baseline: rows come back from details.rows
    rep = tmp_path / "rep.json"
    rep.write_text(json.dumps({"results": [{"details": {"rows": baseline.rows_from_records([rec("deepep", "dispatch", 300.0)])}}]}))
    assert baseline.read_rows(rep)[0]["GBps"] == 300.0
    capsys.readouterr()


def test_cli_baseline_errors(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert check.main(["-t", "baseline", "--baseline", str(bad)]) == 2
    assert check.main(["-t", "baseline", "--baseline", str(tmp_path / "missing")]) == 2
    empty = tmp_path / "e.jsonl"
    _write_jsonl(empty, [rec("deepep", "dispatch", 300.0)])
    assert check.main(["-t", "baseline", "--baseline", str(empty)]) == 0     # nothing in common: WAIVED
    assert "WAIVED" in capsys.readouterr().out


def test_json_is_the_old_name_of_out(tmp_path):
    old, new = tmp_path / "old.jsonl", tmp_path / "new.json"
    _write_jsonl(old, [rec("deepep", "dispatch", 300.0)])
    assert check.main(["-t", "baseline", "--baseline", str(old), "--json", str(new)]) == 0
    assert json.loads(new.read_text())["results"][0]["key"] == "baseline"
