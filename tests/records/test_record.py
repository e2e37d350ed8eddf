"""Records: their shape, whole-line writes after a kill, and resumes that do not repeat WAIVED records
(reading them back: test_reader.py)."""
import json

import pytest

from conftest import ROOT
from moebench import dispatch
from moebench.records import schema
from moebench.records import writer
from moebench.records.reader import read_objects as read_records


def _dispatch(name="alltoall", status="PASS", median=10.0, device="cuda"):
    return {"schema": schema.SCHEMA, "workload": {"num_tokens": 8}, "backend": {"name": name}, "device": device,
            "phase": "dispatch", "check": {"status": status, "error": None},
            "timing": {"median_us": median} if median is not None else None}


def test_schema_names_and_accessors():
    assert schema.SCHEMA != schema.PERMUTE_SCHEMA == "moebench.permute/1"
    d = schema.DispatchRecord(argv=[], repro="", workload={}, device="cpu", backend={"name": "x"}, phase="dispatch",
                              timing=None, traffic={}, check={"status": "WAIVED", "error": "no"}, env={},
                              start_utc="", end_utc="", functional=True).asdict()
    assert d["schema"] == schema.SCHEMA and "kernels" not in d and d["shared_gpu"] is None
    p = schema.PermuteRecord(command="", shape={}, impl="torch", op="permute", check={}, env={}, copy_GBps=1.0,
                             start_utc="", functional=False).asdict()
    assert p["schema"] == schema.PERMUTE_SCHEMA and "timing" not in p
    assert schema.timed(_dispatch()) and not schema.timed(_dispatch(status="FAIL"))
    assert not schema.timed(_dispatch(median=None))
    assert schema.is_functional(_dispatch(device="cpu")) and not schema.is_functional(_dispatch())
    assert not schema.is_functional({**_dispatch(device="cpu"), "functional": False})
    assert schema.error(_dispatch()) == "" and schema.status({}) is None


TINY = """description = "tiny"
hidden = 64
num_experts = 8
topk = 2
num_tokens = [16, 32]
"""


def test_append_after_a_cut_line_keeps_every_new_record(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"a": 1}) + "\n" + '{"schema": "moebench.res')     # a kill mid-write
    writer.write_jsonl(out, [{"b": 2}, {"c": 3}])
    assert [{k: v for k, v in r.items() if k != "_line"} for r in read_records(out)] == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert out.read_text().endswith("\n") and out.read_text().count("\n") == 4


@pytest.mark.slow
def test_sweep_resume_does_not_reappend_waived_records(tmp_path, capsys):
    sw = tmp_path / "tiny.toml"
    sw.write_text(TINY)
    out = tmp_path / "out.jsonl"
    argv = ["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--backend", "deepep", "--out", str(out)]
    for _ in range(3):
        assert dispatch.main(argv) == 0
    recs = read_records(out)
    assert {r["check"]["status"] for r in recs} == {"WAIVED"}
    keys = [(r["sweep"]["case"], r["phase"]) for r in recs]
    assert len(keys) == 4 and len(set(keys)) == 4, keys       # 2 cases x 2 phases, once each


BLOCK_MEGATRON = """
import sys
sys.modules["megatron"] = None          # as if megatron-core were not installed
sys.modules["megatron.core"] = None
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_cpu_tests_pass_without_megatron_core(tmp_path):
    """The CPU tier passes (or skips) on a machine without megatron-core."""
    import subprocess
    import sys
    here = ROOT / "tests"
    p = subprocess.run([sys.executable, "-c", BLOCK_MEGATRON, str(here / "tools" / "test_permute_cli.py")],
                       capture_output=True, text=True, timeout=300, cwd=here.parent)
    assert p.returncode == 0, p.stdout[-3000:]
