"""The container gate meets builds that crash: a deep_ep whose buffer constructor segfaults,
aborts or hangs is FAIL (never WAIVED) with the signal and the crash site, even with no GPU
visible; one that raises cleanly for lack of CUDA is WAIVED. Plus the shared-GPU plan and launch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKES
from moebench.harness.placement import for_roundtrip
from moebench.harness import launch

SMALL = ["--num-tokens", "32", "--hidden", "256", "--num-experts", "8", "--topk", "2", "--iters", "2"]


def run_check(tmp_path, ctor: str, keys=("deepep.roundtrip",), timeout="60"):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"        # HybridEP's JIT check only looks for the file
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    env = {**os.environ, "PYTHONPATH": f"{FAKES}{os.pathsep}{Path.cwd()}", "FAKE_DEEP_EP_CTOR": ctor,
           "CUDA_VISIBLE_DEVICES": "", "CUDA_HOME": str(nvcc.parent.parent)}
    out = tmp_path / "check.json"
    argv = [sys.executable, "-m", "moebench.check", *[a for k in keys for a in ("-t", k)], "--json", str(out),
            "--timeout", timeout, *SMALL]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    rows = {r["key"]: r for r in json.loads(out.read_text())["results"]}
    return p, rows


@pytest.mark.parametrize("ctor,signal", [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
@pytest.mark.slow
def test_buffer_constructor_crash_is_fail_without_a_gpu(tmp_path, ctor, signal):
    p, rows = run_check(tmp_path, ctor, keys=("deepep.roundtrip", "hybridep.roundtrip"))
    assert p.returncode == 1, p.stdout + p.stderr
    for key in ("deepep.roundtrip", "hybridep.roundtrip"):
        r = rows[key]
        assert r["status"] == "FAIL", r
        assert signal in r["summary"] and "Extension modules" not in r["summary"]
    assert "deep_ep/__init__.py" in rows["deepep.roundtrip"]["summary"]      # the crash site


@pytest.mark.slow
def test_clean_cuda_error_without_a_gpu_is_waived(tmp_path):
    p, rows = run_check(tmp_path, "raise")
    r = rows["deepep.roundtrip"]
    assert r["status"] == "WAIVED" and "CUDA is not available" in r["summary"], r
    assert p.returncode == 0


@pytest.mark.slow
def test_hanging_constructor_is_fail(tmp_path):
    p, rows = run_check(tmp_path, "hang", timeout="8")
    r = rows["deepep.roundtrip"]
    assert r["status"] == "FAIL" and "timeout" in r["summary"], r


def test_roundtrip_placement():
    def where(n, sizes=None):
        p = for_roundtrip(n, sizes)
        return p.device, p.ranks, p.ranks_per_gpu
    assert where(8, (2, 4, 8)) == ("cuda", 8, 1)
    assert where(3, (2, 4, 8)) == ("cuda", 2, 2)      # 3 GPUs: no 3-rank kernels, share GPU 0
    assert where(3) == ("cuda", 3, 1)
    assert where(1) == ("cuda", 2, 2)
    assert where(0) == ("cpu", 2, 1)
    assert for_roundtrip(1).functional and for_roundtrip(0).functional and not for_roundtrip(8).functional


def test_shared_gpu_rank_to_device_and_group():
    assert [launch.gpu_of(r, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [launch.gpu_of(r, 4) for r in range(8)] == [0] * 4 + [1] * 4
    assert [launch.gpu_of(r) for r in range(3)] == [0, 1, 2]
    assert launch.pg_backend("cuda", 2) == "gloo"          # NCCL refuses two ranks on one GPU
    assert launch.pg_backend("cuda", 1) == "nccl"
    assert launch.pg_backend("cpu", 1) == "gloo"


def shared_record(**over):
    from moebench.records.schema import DispatchRecord
    w = {"num_tokens": 64, "hidden": 256, "num_experts": 8, "topk": 2, "ep": 2, "dtype": "bf16",
         "routing": "uniform", "seed": 0, "gpus_per_node": 2}
    base = dict(argv=[], repro="", workload=w, device="cuda", backend={"name": "deepep", "knobs": {}, "dedup": True},
                phase="dispatch", timing={"median_us": 7000.0, "p10_us": 6900.0, "p90_us": 7100.0, "samples_us": [7000.0] * 5},
                traffic={"algbw_GBps": 0.5}, check={"status": "PASS", "error": None}, env={"gpu": "NVIDIA H200"},
                start_utc="", end_utc="", functional=True,
                shared_gpu={"ranks_per_gpu": 2, "bypassed": ["deep_ep.buffer.check_nvlink_connections"]})
    base.update(over)
    return DispatchRecord(**base).asdict()


def test_shared_gpu_records_are_labelled_and_refused_as_evidence(tmp_path, capsys):
    from moebench import megatron, report
    from moebench.checks.baseline import rows_from_records
    from moebench.records import tables, writer
    recs = [shared_record(), shared_record(phase="combine"), shared_record(backend={"name": "alltoall", "knobs": {}})]
    assert all(row[-1].endswith("[functional]") for row in tables.table_rows(recs))
    f = tmp_path / "shared.jsonl"
    writer.write_jsonl(f, recs)
    assert "functional only" in report.tables(recs)
    assert report.main(["--compare", "deepep", "alltoall", str(f)]) == 2
    assert "functional only" in capsys.readouterr().err
    assert megatron.main(["flags", "--results", str(f), "--megatron-core-version", "0.16.1"]) == 2
    assert "not performance evidence" in capsys.readouterr().err
    assert all(r["functional"] for r in rows_from_records(recs))


def test_check_baseline_refuses_a_functional_baseline(tmp_path):
    from moebench.records import writer
    f = tmp_path / "shared.jsonl"
    writer.write_jsonl(f, [shared_record()])
    out = tmp_path / "c.json"
    p = subprocess.run([sys.executable, "-m", "moebench.check", "-t", "baseline", "--baseline", str(f), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    row = json.loads(out.read_text())["results"][0]
    assert p.returncode == 1 and row["status"] == "FAIL" and "functional only" in row["summary"], row


def test_deepep_without_nvshmem_is_named_as_unusable_for_megatron(monkeypatch):
    from moebench.checks.ep import judge_megatron
    from moebench.env.deepep import rdma_size_problem
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "deep_ep", raising=False)
    assert rdma_size_problem() is None
    monkeypatch.setenv("FAKE_DEEP_EP_NO_NVSHMEM", "1")
    why = rdma_size_problem()
    assert "without NVSHMEM" in why and "flex/deepep" in why
    assert judge_megatron({"HAVE_DEEP_EP": True, "deepep_build_problem": why}, {"deepep"}) == [why]
    assert judge_megatron({"HAVE_DEEP_EP": True}, {"deepep"}) == []


def test_roundtrip_outcome_names_the_soak():
    from moebench.checks.ep import judge_roundtrip
    timed = {"backend": {"name": "deepep"}, "phase": "dispatch", "workload": {"num_tokens": 64, "hidden": 2048,
             "num_experts": 16, "topk": 4, "ep": 2, "dtype": "bf16", "routing": "uniform", "seed": 0,
             "gpus_per_node": 2}, "timing": {"us": 10.0}, "traffic": {"algbw_GBps": 5.0},
             "check": {"status": "PASS"}}
    soak = {**timed, "phase": "soak", "timing": None, "traffic": {},
            "soak": {"summary": "0 of 2000: < 0.15% at 95%", "graph": {"replays": 2000, "corrupted": 0}}}
    out = judge_roundtrip([timed, soak], "deepep", "EP 2")
    assert out.status == "PASS" and "soak 0 of 2000: < 0.15% at 95%, graph 2000 replays right" in out.summary
    assert [r["phase"] for r in out.details["rows"]] == ["dispatch"]        # a soak is not a bandwidth row
