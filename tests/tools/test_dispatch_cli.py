"""The main job end to end on CPU/gloo, and every bad input: one line, exit 2, no traceback."""
import json
import os
import subprocess
import sys

import pytest

from moebench import dispatch
from moebench.records import schema
from moebench.records.reader import read_objects as read_records


@pytest.mark.slow
def test_ep4_cpu_run_writes_valid_jsonl(tmp_path):
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", "--ep", "4", "--device", "cpu",
                        "--backend", "alltoall", "--num-tokens", "64", "--hidden", "256",
                        "--num-experts", "16", "--topk", "4", "--iters", "3", "--out", str(out)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "functional only" in p.stdout
    recs = read_records(out)
    assert [r["phase"] for r in recs] == ["dispatch", "combine"]
    for r in recs:
        assert r["check"]["status"] == "PASS"
        assert r["timing"]["iters"] == 3 and len(r["timing"]["samples_us"]) == 3
        assert r["timing"]["median_us"] > 0
        assert r["traffic"]["algbw_GBps"] > 0 and r["traffic"]["busbw_GBps"] > 0
        assert r["workload"]["ep"] == 4 and r["env"]["torch"]
        assert r["repro"].startswith("python -m moebench.dispatch --ep 4")
        assert r["schema"] == schema.SCHEMA and r["functional"] is True and r["shared_gpu"] is None
        assert schema.is_functional(r) and "sweep" not in r
        json.dumps(r)


@pytest.mark.slow
def test_profile_records_each_phase_pieces(tmp_path):
    out = tmp_path / "r.jsonl"
    rc = dispatch.main(["--ep", "2", "--device", "cpu", "--backend", "alltoall", "--num-tokens", "32",
                        "--hidden", "64", "--num-experts", "8", "--topk", "2", "--iters", "2",
                        "--profile", "--out", str(out)])
    assert rc == 0
    recs = read_records(out)
    assert [r["phase"] for r in recs] == ["dispatch", "combine"]
    for r in recs:
        names = [k["kernel"] for k in r["kernels"]]
        assert names and all(k["us_per_iter"] > 0 and k["calls_per_iter"] > 0 for k in r["kernels"])
        assert any("all_to_all" in n or "alltoall" in n for n in names), names   # the exchange shows up


@pytest.mark.slow
def test_joins_torchrun_and_only_rank0_reports(tmp_path):
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "-m", "moebench.dispatch", "--ep", "2", "--device", "cpu", "--backend", "alltoall",
                        "--num-tokens", "16", "--hidden", "128", "--num-experts", "8", "--topk", "2",
                        "--iters", "2", "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("records appended") == 1
    assert [r["check"]["status"] for r in read_records(out)] == ["PASS", "PASS"]


def test_waived_backend_is_reported_not_fatal(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = dispatch.main(["--ep", "2", "--device", "cpu", "--backend", "deepep", "--num-tokens", "8",
                        "--hidden", "256", "--num-experts", "8", "--topk", "2", "--out", str(out)])
    assert rc == 0
    recs = read_records(out)
    assert {r["check"]["status"] for r in recs} == {"WAIVED"}
    assert "deep_ep" in recs[0]["check"]["error"]


@pytest.mark.parametrize("argv, msg", [
    (["--num-experts", "30", "--ep", "4"], "not divisible"),
    (["--topk", "0"], "--topk"),
    (["--topk", "300"], "--topk"),
    (["--num-tokens", "0"], "--num-tokens"),
    (["--hidden", "-1"], "--hidden"),
    (["--ep", "64", "--num-experts", "256", "--device", "cuda"], "use --device cpu"),
    (["--backend", "nccl-magic"], "unknown backend"),
    (["--routing", "pareto:2"], "unknown routing"),
    (["--routing", "trace:/no/such/file.pt"], "routing trace /no/such/file.pt: expected a .pt file"),
    (["--dtype", "fp8", "--backend", "hybridep", "--hidden", "768"], "fp8"),
    (["--backend", "hybridep", "--hidden", "100"], "hidden"),
    (["--knob", "num_sms"], "KEY=VALUE"),
    (["--backend", "deepep", "--num-sms", "3", "--ep", "2", "--device", "cpu"], "even"),
])
def test_bad_input_is_one_line_and_exit_2(argv, msg, capsys):
    rc = dispatch.main(argv + ["--out", "/dev/null"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and msg in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_fp8_through_each_cpu_impl_passes_the_oracle(tmp_path, impl):
    """The fp8 path of every implementation the CPU tier runs (the torch reference; Triton under its
    interpreter), rows and scales through the oracle, dispatch and combine, as the main job runs it."""
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", "--ep", "2", "--device", "cpu", "--dtype", "fp8",
                        "--backend", "alltoall", "--ops-impl", impl, "--num-tokens", "24", "--hidden", "256",
                        "--num-experts", "8", "--topk", "3", "--iters", "1", "--views", "api", "--out", str(out)],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    recs = read_records(out)
    assert [(r["phase"], r["check"]["status"]) for r in recs] == [("dispatch", "PASS"), ("combine", "PASS")]
    assert {r["workload"]["dtype"] for r in recs} == {"fp8"}
    assert {r["backend"]["knobs"]["ops_impl"] for r in recs} == {impl}
