"""schema.py: one tolerant reader for every consumer, the records' schema names, the accessors."""
import json

import pytest

from moebench.checks import baseline
from moebench.records import schema


def _dispatch(name="alltoall", status="PASS", median=10.0, device="cuda"):
    return {"schema": schema.SCHEMA, "workload": {"num_tokens": 8}, "backend": {"name": name}, "device": device,
            "phase": "dispatch", "check": {"status": status, "error": None},
            "timing": {"median_us": median} if median is not None else None}


def test_reader_skips_garbage_and_a_partial_last_line(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    good = [_dispatch("alltoall"), _dispatch("deepep")]
    f.write_text(json.dumps(good[0]) + "\n" + "garbage \x00 line\n" + "[1, 2]\n\n" + json.dumps(good[1]) + "\n"
                 + json.dumps(good[0])[:25])
    got = schema.read(f)
    assert got == good
    err = capsys.readouterr().err
    assert err.count("skipped a line") == 3 and f"{f}:2:" in err and f"{f}:6:" in err


def test_reader_missing_file_and_dispatch_filter(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        schema.read(tmp_path / "nope.jsonl")
    f = tmp_path / "mixed.jsonl"
    permute_rec = {"schema": schema.PERMUTE_SCHEMA, "workload": {}, "backend": {}}
    f.write_text("\n".join(json.dumps(r) for r in (_dispatch(), permute_rec, {"workload": 1})) + "\n")
    got = schema.read_dispatch([f])
    assert [schema.name(r) for r in got] == ["alltoall"] and got[0]["_file"] == str(f)


def test_consumers_share_the_reader(tmp_path):
    """check --baseline accepts the same partly garbled file that report accepts."""
    f = tmp_path / "r.jsonl"
    r = _dispatch()
    r.update(workload={"num_tokens": 8, "hidden": 16, "num_experts": 4, "topk": 2, "ep": 1, "dtype": "bf16",
                       "routing": "uniform", "seed": 0, "gpus_per_node": 8},
             traffic={"algbw_GBps": 5.0})
    f.write_text(json.dumps(r) + "\n" + '{"cut sh')
    assert [row["GBps"] for row in baseline.read_rows(f)] == [5.0]
    assert len(schema.read_dispatch([f])) == 1
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json at all\n")
    with pytest.raises(ValueError, match="no JSON records"):
        baseline.read_rows(junk)


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
