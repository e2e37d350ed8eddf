"""The capability matrix (issue 54 part 5): a sweep records its refused cells as records, and `report --matrix`
(and the sweep's end of run) shows backend x case cells PASS / CLAMPED / WAIVED / REFUSED / FAIL with a one-word
reason; --markdown, --json and a PNG heat map; a file with no sweep records is one line, exit 2."""
import json

import pytest

from moebench.records import matrix

SWEEP = """
description = "a case this machine runs (on CUDA) and one no machine holds"
hidden = 64
num_experts = 8
topk = 2
num_tokens = [8, 100000000000]
"""


def test_a_sweep_records_its_refused_and_waived_cells_and_ends_with_the_matrix(run_tool, tmp_path):
    """mcore-alltoall needs CUDA (WAIVED on CPU before any rank starts); 10^11 tokens is refused by the preflight:
    no rank process starts at all."""
    sweep, out = tmp_path / "cells.toml", tmp_path / "r.jsonl"
    sweep.write_text(SWEEP)
    p = run_tool("moebench.dispatch", "--sweep", str(sweep), "--device", "cpu", "--ep", "2", "--backend",
                 "mcore-alltoall", "--out", str(out))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["workload"]["num_tokens"], r["phase"], r["check"]["status"]) for r in recs] == [
        (8, "dispatch", "WAIVED"), (8, "combine", "WAIVED"),
        (10**11, "dispatch", "REFUSED"), (10**11, "combine", "REFUSED")]
    assert recs[2]["sweep"]["name"] == "cells" and "GiB of host memory" in recs[2]["check"]["error"]
    assert "--num-tokens 100000000000" in recs[2]["repro"]
    table = p.stdout[p.stdout.index("# capability matrix: sweep cells"):].splitlines()
    assert table[1].split() == ["backend", "T=8", "T=100000000000"]
    assert table[3].split() == ["mcore-alltoall", "WAIVED", "cuda", "REFUSED", "memory"]
    again = run_tool("moebench.dispatch", "--sweep", str(sweep), "--device", "cpu", "--ep", "2", "--backend",
                     "mcore-alltoall", "--out", str(out))
    assert again.returncode == 0 and len(out.read_text().splitlines()) == 4     # known cells are not appended twice


def rec(backend, T, phase, status="PASS", error=None, crash=None, sms=None, used=None, sweep="s"):
    knobs = {"num_sms": sms, "num_sms_used": used} if used is not None else {}      # --num-sms given to the sweep
    return {"schema": "moebench.result/1", "device": "cuda", "env": {"gpu": "NVIDIA H200"}, "phase": phase,
            "workload": {"num_tokens": T, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16",
                         "routing": "uniform", "seed": 0, "gpus_per_node": 8},
            "backend": {"name": backend, "knobs": knobs},
            "timing": {"median_us": 100.0} if status == "PASS" else None,
            "check": {"status": status, "error": error, **({"crash": crash} if crash else {})},
            "sweep": {"name": sweep, "case": f"{backend}{T}", "knobs": {}}}


def cells() -> list[dict]:
    both = lambda *a, **k: [rec(*a, "dispatch", **k), rec(*a, "combine", **k)]  # noqa: E731
    return [*both("alltoall", 128), *both("alltoall", 4096),
            *both("deepep", 128, sms=200, used=132), *both("deepep", 4096, sms=24, used=24),
            rec("hybridep", 128, "dispatch", "FAIL", "ranks [1] did not finish within 600 s (timeout)", crash="hang"),
            rec("hybridep", 128, "combine", "FAIL", "ranks [1] did not finish within 600 s (timeout)", crash="hang"),
            *both("hybridep", 4096, status="FAIL", error="combine: rank 0: 3 tokens off the oracle"),
            *both("ncclep", 128, status="WAIVED", error="nccl-extensions not installed; pip install ..."),
            # a FAIL rerun with --redo-failed that passed: the last record of each phase wins
            *both("ncclep", 4096, status="FAIL", error="killed by SIGSEGV", crash="SIGSEGV"), *both("ncclep", 4096)]


def test_each_cell_is_its_last_runs_status_with_one_word():
    [m] = matrix.matrices(cells() + [{**rec("alltoall", 8, "dispatch"), "sweep": None}])   # untagged: left out
    assert [lb for _, lb in m["cases"]] == ["T=128", "T=4096"]
    knob = {**rec("deepep", 128, "dispatch"), "sweep": {"name": "k", "case": "x", "knobs": {"num_sms": 16}}}
    assert [lb for _, lb in matrix.matrices([knob])[0]["cases"]] == ["T=128 num_sms=16"]   # a knob sweep's case
    got = {b: [matrix.text(m["cells"].get((b, k))) for k, _ in m["cases"]] for b in m["backends"]}
    assert got == {"alltoall": ["PASS", "PASS"], "deepep": ["CLAMPED sms", "PASS"],
                   "hybridep": ["FAIL hang", "FAIL oracle"], "ncclep": ["WAIVED package", "PASS"]}
    assert m["cells"][("deepep", m["cases"][0][0])].error == "asked 200 SMs, used 132"


@pytest.mark.parametrize("status, error, crash, word", [
    ("FAIL", "killed by SIGKILL (likely out of memory)", "SIGKILL", "oom"),
    ("FAIL", "soak: 3 of 2000 calls corrupted (0.15%)", None, "corrupt"),
    ("FAIL", "refused: repeat 2 gave deepep other inputs than alltoall: payload SHA-256 ...", None, "inputs"),
    ("WAIVED", "megatron-core's token dispatchers need CUDA; run with --device cuda", None, "cuda"),
    ("WAIVED", "cannot take this run: hybridep needs experts per rank divisible by 4", None, "shape"),
    ("REFUSED", "deepep on EP 8 needs ~90.1 GiB of device memory", None, "memory"),
    ("WAIVED", "the moon is in the wrong house", None, "other")])
def test_reasons_are_one_word(status, error, crash, word):
    assert matrix.reason(status, error, crash) == word


def test_report_matrix_text_markdown_json_and_heat_map(run_tool, tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in cells()))
    png = tmp_path / "m.png"
    p = run_tool("moebench.report", "--matrix", str(f), "--plot", str(png))
    assert p.returncode == 0, p.stderr
    assert "# capability matrix: sweep s (4 backends x 2 cases; cuda, NVIDIA H200)" in p.stdout
    assert "# FAIL hang: ranks [1] did not finish within 600 s (timeout)" in p.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    md = run_tool("moebench.report", "--matrix", str(f), "--markdown").stdout
    rows = {cols[1]: cols[2:-1] for line in md.splitlines() if line.startswith("| ")
            for cols in [[c.strip() for c in line.split("|")]]}
    assert rows["deepep"] == ["CLAMPED sms", "PASS"] and rows["backend"] == ["T=128", "T=4096"]
    js = json.loads(run_tool("moebench.report", "--matrix", str(f), "--json").stdout)
    assert {(c["backend"], c["case"], c["status"], c["reason"]) for c in js[0]["cells"]} >= {
        ("hybridep", "T=4096", "FAIL", "oracle"), ("ncclep", "T=128", "WAIVED", "package")}


def test_a_matrix_of_a_file_without_sweep_records_is_one_line_before_any_work(run_tool, tmp_path):
    f = tmp_path / "single.jsonl"
    f.write_text("".join(json.dumps({**r, "sweep": None}) + "\n" for r in cells()[:2]))
    png = tmp_path / "never.png"
    for argv in (("--matrix", str(f), "--plot", str(png)), ("--matrix", str(f), str(f))):
        p = run_tool("moebench.report", *argv)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "no sweep records (it holds 2 record(s) of single runs" in run_tool("moebench.report", "--matrix", str(f)).stderr
    assert "not with FILE..." in p.stderr and not png.exists()
