"""record.py: one tolerant reader for every consumer, the records' schema names, the accessors."""
import json

import pytest

from moebench import record
from moebench.checks import baseline


def _dispatch(name="alltoall", status="PASS", median=10.0, device="cuda"):
    return {"schema": record.SCHEMA, "workload": {"num_tokens": 8}, "backend": {"name": name}, "device": device,
            "phase": "dispatch", "check": {"status": status, "error": None},
            "timing": {"median_us": median} if median is not None else None}


def test_reader_skips_garbage_and_a_partial_last_line(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    good = [_dispatch("alltoall"), _dispatch("deepep")]
    f.write_text(json.dumps(good[0]) + "\n" + "garbage \x00 line\n" + "[1, 2]\n\n" + json.dumps(good[1]) + "\n"
                 + json.dumps(good[0])[:25])
    got = record.read(f)
    assert got == good
    err = capsys.readouterr().err
    assert err.count("skipped a line") == 3 and f"{f}:2:" in err and f"{f}:6:" in err


def test_reader_missing_file_and_dispatch_filter(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        record.read(tmp_path / "nope.jsonl")
    f = tmp_path / "mixed.jsonl"
    permute_rec = {"schema": record.PERMUTE_SCHEMA, "workload": {}, "backend": {}}
    f.write_text("\n".join(json.dumps(r) for r in (_dispatch(), permute_rec, {"workload": 1})) + "\n")
    got = record.read_dispatch([f])
    assert [record.name(r) for r in got] == ["alltoall"] and got[0]["_file"] == str(f)


def test_consumers_share_the_reader(tmp_path):
    """check --baseline accepts the same partly garbled file that report accepts."""
    f = tmp_path / "r.jsonl"
    r = _dispatch()
    r.update(workload={"num_tokens": 8, "hidden": 16, "num_experts": 4, "topk": 2, "ep": 1, "dtype": "bf16",
                       "routing": "uniform", "seed": 0, "gpus_per_node": 8},
             traffic={"algbw_GBps": 5.0})
    f.write_text(json.dumps(r) + "\n" + '{"cut sh')
    assert [row["GBps"] for row in baseline.read_rows(f)] == [5.0]
    assert len(record.read_dispatch([f])) == 1
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json at all\n")
    with pytest.raises(ValueError, match="no JSON records"):
        baseline.read_rows(junk)


def test_schema_names_and_accessors():
    assert record.SCHEMA != record.PERMUTE_SCHEMA == "moebench.permute/1"
    d = record.DispatchRecord(argv=[], repro="", workload={}, device="cpu", backend={"name": "x"}, phase="dispatch",
                              timing=None, traffic={}, check={"status": "WAIVED", "error": "no"}, env={},
                              start_utc="", end_utc="", functional=True).asdict()
    assert d["schema"] == record.SCHEMA and "kernels" not in d and d["shared_gpu"] is None
    p = record.PermuteRecord(command="", shape={}, impl="torch", op="permute", check={}, env={}, copy_GBps=1.0,
                             start_utc="", functional=False).asdict()
    assert p["schema"] == record.PERMUTE_SCHEMA and "timing" not in p
    assert record.timed(_dispatch()) and not record.timed(_dispatch(status="FAIL"))
    assert not record.timed(_dispatch(median=None))
    assert record.is_functional(_dispatch(device="cpu")) and not record.is_functional(_dispatch())
    assert not record.is_functional({**_dispatch(device="cpu"), "functional": False})
    assert record.error(_dispatch()) == "" and record.status({}) is None
