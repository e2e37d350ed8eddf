"""Issue 13, item 7: plan's bad numbers are one line naming the flag, exit 2 (never replaced by a
default), and CPU/shared-GPU results are not used as measurements."""
import json

import pytest

from moebench import plan

BASE = ["--ep", "8", "--num-tokens", "256", "--hidden", "256"]


@pytest.mark.parametrize("argv, flag", [
    (["--gpus", "0", *BASE], "--gpus"), ([*BASE, "--net-gbps", "0"], "--net-gbps"),
    ([*BASE, "--net-gbps", "-1"], "--net-gbps"), ([*BASE, "--nvlink-gbps", "-1"], "--nvlink-gbps"),
    ([*BASE, "--nvlink-gbps", "0"], "--nvlink-gbps"), ([*BASE, "--nvlink-gbps", "nan"], "--nvlink-gbps"),
    (["--ep", "0"], "--ep"), (["--gpus", "16", "--ep", "0"], "--ep"),
])
def test_bad_plan_numbers_name_their_flag(capsys, argv, flag):
    assert plan.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"moebench.plan: error: {flag} "), err


def measured(device, functional, busbw=300.0):
    return {"workload": {"num_tokens": 256, "hidden": 256, "topk": 8, "dtype": "bf16"}, "backend": {"name": "deepep"},
            "device": device, "functional": functional, "phase": "dispatch", "timing": {"median_us": 1.0},
            "check": {"status": "PASS"}, "traffic": {"bus_bytes": 1.0, "net_bytes": 0.0, "busbw_GBps": busbw}}


def test_cpu_results_are_not_measurements(tmp_path, capsys):
    cpu = tmp_path / "cpu.jsonl"
    cpu.write_text(json.dumps(measured("cpu", True, 0.05)) + "\n")
    assert plan.main([*BASE, "--results", str(cpu)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("moebench.plan: error: --results: every record is functional only"), err
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps(measured("cpu", True, 0.05)) + "\n" + json.dumps(measured("cuda", False)) + "\n")
    assert plan.main([*BASE, "--results", str(both), "--json"]) == 0
    out, err = capsys.readouterr()
    p = json.loads(out)
    nominal = p["predicted_us"]["nominal"]["dispatch"]
    assert p["predicted_us"]["measured:deepep"]["dispatch"] == pytest.approx(nominal * 450 / 300)   # the GPU row only
    assert "left out 1 record" in err
