"""python -m moebench.permute on CPU: records per impl and op, bad input exits 2."""
from __future__ import annotations

import json

import pytest

from moebench import permute
from moebench.toolkit import installed


def test_cpu_run_writes_records(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    rc = permute.main(["--ops-impl", "torch,megatron", "--shapes", "32x64x2x4", "--iters", "2",
                       "--out", str(out)])
    assert rc == 0
    assert "CPU times are not performance figures" in capsys.readouterr().out
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["schema"] for r in recs} == {"moebench.permute/1"} and all(r["functional"] for r in recs)
    torch_ops = {r["op"] for r in recs if r["impl"] == "torch"}
    assert torch_ops == {"permute", "permute_wait", "unpermute"}
    assert all(r["check"]["status"] == "PASS" for r in recs if r["impl"] == "torch")
    t = next(r for r in recs if r["impl"] == "torch" and r["op"] == "permute")
    assert t["bytes"] == (32 + t["shape"]["R"]) * 64 * 2 and t["timing"]["iters"] == 2
    mega = [r for r in recs if r["impl"] == "megatron"]
    if not installed("megatron.core"):                     # the rest needs megatron-core
        assert mega and {r["check"]["status"] for r in mega} == {"WAIVED"}
        return
    assert "permute_wait" not in {r["op"] for r in mega}   # megatron needs the row count
    if mega and mega[0]["check"]["status"] == "PASS":
        assert "speedup_vs_megatron" in next(r for r in recs if r["impl"] == "torch"
                                             and r["op"] == "permute_wait")


@pytest.mark.parametrize("argv", [["--shapes", "4x8x5x4"], ["--shapes", "4x8"], ["--ops-impl", "nope"], ["--impl", "nope"],
                                  ["--ops", "gather"], ["--iters", "0"]])
def test_bad_input_exits_2(argv, capsys):
    assert permute.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moebench.permute: ")


def test_out_appends_and_old_flag_names_still_work(tmp_path):
    out = tmp_path / "p.jsonl"
    argv = ["--shapes", "16x32x2x4", "--iters", "1", "--ops", "permute", "--out", str(out)]
    assert permute.main(["--ops-impl", "torch", "--no-flush-l2", *argv]) == 0
    assert permute.main(["--impl", "torch", "--no-flush", *argv]) == 0          # hidden aliases
    assert [json.loads(line)["impl"] for line in out.read_text().splitlines()] == ["torch", "torch"]
