"""The one reader of every offline input (records/reader.py, records/validate.py): a malformed line is
skipped and counted with its file:line, or refused when nothing usable is left; a figure that is not a
finite number > 0 is refused by the tools that judge; a file that cannot be one is refused by name; never a
traceback. The unit tests sweep the bad inputs; the CLI tests drive each offline tool as a subprocess."""
import copy
import json
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from moebench.checks import baseline
from moebench.checks.registry import Context, Result
from moebench.core.workload import WorkloadError
from moebench.harness import sweep
from moebench.megatron import ab
from moebench.records import reader, schema, validate
from moebench.records.reader import RecordError

W = {"num_tokens": 4096, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16",
     "routing": "uniform", "seed": 0, "gpus_per_node": 8}


def rec(name="deepep", phase="dispatch", median=300.0, **top) -> dict:
    """A moebench.dispatch record as the tools read it (samples spread 2% around the median)."""
    s = [median * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)]
    return {"schema": "moebench.result/1", "workload": dict(W), "device": "cuda", "functional": False,
            "env": {"gpu": "NVIDIA H200", "env": {}}, "backend": {"name": name, "knobs": {}}, "phase": phase,
            "timing": {"median_us": median, "p10_us": s[0], "p90_us": s[-1], "min_us": s[0], "iters": 5,
                       "samples_us": s},
            "traffic": {"bytes": 1e6, "bus_bytes": 8e5, "algbw_GBps": 1e3 / median, "busbw_GBps": 8e2 / median},
            "check": {"status": "PASS", "error": None}, **top}


def changed(path: str, value) -> bytes:
    """rec() with the value at a dotted path replaced (or removed: value is DROP), as a JSONL line."""
    r = copy.deepcopy(rec())
    *parents, last = path.split(".")
    d = r
    for k in parents:
        d = d[k]
    if value is DROP:
        del d[last]
    else:
        d[last] = value
    return json.dumps(r).encode()


DROP = object()
GOOD = json.dumps(rec()).encode()

# (the bad line, a phrase its message must hold): lines no record can be read from, or of the wrong shape
MALFORMED = [
    (b"[1, 2]", "a JSON list, not a record"),
    (b'"a string"', "'a string', not a record"),
    (b"null", "null, not a record"),
    (b"42", "42, not a record"),
    (b"garbage \x00", "not JSON"),
    (GOOD[:40], "not JSON"),                                            # a line cut short by a kill
    (b"{}{}", "more than one JSON value"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"workload": ' + b"[" * 100 + b"]" * 100 + b"}", "nested deeper than 64"),
    (b'{"workload": {"num_tokens": ' + b"9" * 5000 + b"}}", "a number too long to read"),
    (b'{"backend": {"name": "caf\xe9"}}', "not UTF-8 text at byte"),
    (b'{"backend": {"name": "\\ud800"}}', "lone UTF-16 surrogate"),
    (changed("workload", [1, 2]), "workload is a JSON list, not an object"),
    (changed("workload", None), "workload is null, not an object"),
    (changed("workload", DROP), "workload is missing"),
    (changed("workload.hidden", "x"), "workload.hidden is 'x', not an integer"),
    (changed("workload.hidden", True), "workload.hidden is true, not an integer"),
    (changed("workload.ep", 0), "workload.ep is 0, not an integer from 1"),
    (changed("workload.num_tokens", 10 ** 3999), "workload.num_tokens is a 4000-digit integer"),
    (changed("workload.topk", DROP), "workload.topk is missing"),
    (changed("workload.dtype", 16), "workload.dtype is 16, not a string"),
    (changed("workload.routing", {"kind": "zipf"}), "workload.routing is a JSON object, not a single value"),
    (changed("backend", DROP), "backend is missing"),
    (changed("backend", "deepep"), "backend is 'deepep', not an object"),
    (changed("backend.name", 3), "backend.name is 3, not a backend name"),
    (changed("backend.name", ""), "backend.name is '', not a backend name"),
    (changed("backend.knobs", [1]), "backend.knobs is a JSON list, not an object"),
    (changed("backend.knobs", {"num_sms": "many"}), "backend.knobs.num_sms is 'many'"),
    (changed("phase", None), "phase is null"),
    (changed("check", None), "check is null, not an object"),
    (changed("check.status", DROP), "check.status is missing"),
    (changed("timing", "fast"), "timing is 'fast', not an object"),
    (changed("timing.median_us", DROP), "timing.median_us is missing"),
    (changed("timing.median_us", None), "timing.median_us is null"),
    (changed("timing.samples_us", "many"), "timing.samples_us is 'many', not a list"),
    (changed("timing.iters", "5"), "timing.iters is '5', not an integer"),
    (changed("views", {"graph": "fast"}), "views.graph is 'fast', not an object"),
    (changed("timing.per_rank_us", "slow"), "timing.per_rank_us is 'slow', not a list of times"),
    (changed("timing.slowest_rank", -1), "timing.slowest_rank is -1, not an integer from 0"),
    (changed("views", {"cached": {"us": 1.0, "slowest_rank": "one"}}), "views.cached.slowest_rank is 'one'"),
    (changed("env", [1]), "env is a JSON list, not an object"),
    (changed("functional", "yes"), "functional is 'yes', not true or false"),
    (changed("shared_gpu", {"note": "x"}), "shared_gpu.ranks_per_gpu is missing"),
    (changed("sweep", {"case": 1}), "sweep.case is 1, not a string"),
    (changed("overlap", {"gemm": "x"}), "overlap.comm_alone_us is missing"),
    (changed("memory", 5), "memory is 5, not an object"),
    (changed("memory", {"max": [1]}), "memory.max is a JSON list, not an object"),
    (changed("memory", {"per_rank": [3]}), "memory.per_rank holds an entry that is not an object"),
    (changed("memory", {"max": {"footprint_bytes": "big"}}), "memory.max.footprint_bytes is 'big', not an integer"),
    (changed("memory", {"max": {"footprint_bytes": -1}}), "memory.max.footprint_bytes is -1"),
    (changed("memory", {"none": 3}), "memory.none is 3, not a string"),
    (changed("routing_sha256", "abc"), "routing_sha256 is 'abc', not a SHA-256 in hex"),
    (changed("payload_sha256", 7), "payload_sha256 is 7, not a SHA-256 in hex"),
    (changed("repeat", [0, 3]), "repeat is a JSON list, not an object"),
    (changed("repeat", {"index": "0", "of": 3, "run": "r"}), "repeat.index is '0', not a count"),
    (changed("repeat", {"index": 0, "of": 0, "run": "r"}), "repeat.of is 0, not an integer from 1"),
    (changed("repeat", {"index": 3, "of": 3, "run": "r"}), "repeat.index 3 is not below repeat.of 3"),
    (changed("repeat", {"index": 0, "of": 3}), "repeat.run is missing"),
    (changed("setup", 5), "setup is 5, not an object"),
    (changed("setup", {"per_rank": {}}), "setup.per_rank is a JSON object, not a list"),
    (changed("fault", {"injected": "kill:1@2"}), "fault.verdict is missing"),
]
# impossible figures in records of the right shape: skipped by report tables, refused by the tools that judge
IMPOSSIBLE = [
    (changed("timing.median_us", math.nan), "timing.median_us is NaN"),
    (changed("timing.median_us", 0), "timing.median_us is 0"),
    (changed("timing.median_us", -300.0), "timing.median_us is -300.0"),
    (GOOD.replace(b'"median_us": 300.0', b'"median_us": 1e999'), "timing.median_us is Infinity"),
    (changed("timing.median_us", 10 ** 400), "timing.median_us is a 401-digit integer"),
    (changed("timing.median_us", "fast"), "timing.median_us is 'fast', not a number"),
    (changed("timing.p90_us", 1.0), "timing.p10_us 294.0, median_us 300.0, p90_us 1.0 are out of order"),
    (changed("timing.samples_us", [300.0, 0.0, 301.0]), "timing.samples_us[1] is 0.0"),
    (changed("timing.samples_us", [300.0, math.inf]), "timing.samples_us[1] is Infinity"),
    (changed("views", {"graph": {"us": 10.0, "samples_us": [math.nan]}}), "views.graph.samples_us[0] is NaN"),
    (changed("views", {"cached": {"mean_us": -1.0}}), "views.cached.mean_us is -1.0"),
    (changed("timing.p99_us", math.nan), "timing.p99_us is NaN"),
    (changed("timing.per_rank_us", [300.0, 0.0]), "timing.per_rank_us[1] is 0.0"),
    (changed("views", {"graph": {"us": 1.0, "p999_us": -2.0}}), "views.graph.p999_us is -2.0"),
    (changed("views", {"api": {"us": 1.0, "slowest_rank_share": 2.0}}),
     "views.api.slowest_rank_share is 2.0: not a fraction of the iterations"),
    (changed("timing.samples_us", [1e-300] * 3), "timing.samples_us[0] is 1e-300: outside what a measurement can be"),
    (changed("views", {"cached": {"us": 1e300}}), "views.cached.us is 1e+300: outside what a measurement can be"),
    (changed("traffic.algbw_GBps", 1e308), "traffic.algbw_GBps is 1e+308: outside what a measurement can be"),
    (changed("traffic.algbw_GBps", math.nan), "traffic.algbw_GBps is NaN"),
    (changed("traffic.algbw_GBps", 0.0), "traffic.algbw_GBps is 0.0: not a finite number > 0 while traffic.bytes"),
    (changed("traffic.busbw_GBps", -2.0), "traffic.busbw_GBps is -2.0"),
    (changed("traffic.bus_bytes", math.nan), "traffic.bus_bytes is NaN"),
    (changed("overlap", {"gemm": "x", "comm_alone_us": 1.0, "gemm_alone_us": 0.0, "gemm_alone_p90_us": 1.0,
                         "overlapped_us": 1.0, "overlapped_p10_us": 1.0, "overlapped_p90_us": 1.0,
                         "gemm_overlapped_us": 1.0, "gemm_slowdown": 1.0, "exposed_us": -0.5}),
     "overlap.gemm_alone_us is 0.0"),
    (changed("setup", {"max": {"build_ms": -1.0}}), "setup.max.build_ms is -1.0"),
]


def write(tmp_path, *lines: bytes, name="r.jsonl") -> str:
    p = tmp_path / name
    p.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(p)


def ids(cases) -> list[str]:
    return [why for _, why in cases]


@pytest.mark.parametrize("bad, why", MALFORMED + IMPOSSIBLE, ids=ids(MALFORMED + IMPOSSIBLE))
def test_a_malformed_line_is_skipped_counted_and_named(tmp_path, capsys, bad, why):
    f = write(tmp_path, GOOD, bad, json.dumps(rec("alltoall")).encode())
    got = reader.read_dispatch([f], "moebench.report")
    assert [(r["backend"]["name"], r["_line"], r["_file"]) for r in got] == [("deepep", 1, f), ("alltoall", 3, f)]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("# moebench.report: skipped 1 malformed line: ")
    assert f"{f}:2 (" in err[0] and why in err[0], err


@pytest.mark.parametrize("bad, why", MALFORMED, ids=ids(MALFORMED))
def test_a_file_of_nothing_else_is_refused_with_the_first_bad_line(tmp_path, bad, why):
    f = write(tmp_path, bad, b"", bad)
    with pytest.raises(RecordError) as e:
        reader.read_dispatch([f], "t")
    msg = str(e.value)
    assert msg.startswith(f"{f}: no usable moebench.dispatch records: {f}:1: ") and why in msg
    assert msg.endswith("(and 1 more malformed line)") and "\n" not in msg


@pytest.mark.parametrize("bad, why", IMPOSSIBLE, ids=ids(IMPOSSIBLE))
def test_tools_that_judge_refuse_an_impossible_figure(tmp_path, capsys, bad, why):
    f = write(tmp_path, GOOD, GOOD, bad)
    with pytest.raises(RecordError, match="^" + re.escape(f"{f}:3: {why}")) as e:
        reader.read_dispatch([f], "t", verdict=True)
    assert "refused" in str(e.value) and capsys.readouterr().err == ""


def test_tools_that_judge_refuse_a_line_of_the_wrong_shape_naming_the_first(tmp_path, capsys):
    """A verdict from what is left of a damaged A/B would be a verdict on another A/B (issue 50: `megatron
    flags` printed flags from the rest); the tools that only show records still skip and count."""
    f = write(tmp_path, GOOD, b"[1]", GOOD[:30])
    with pytest.raises(RecordError, match="^" + re.escape(f"{f}:2: a JSON list, not a record object; refused: ")
                       + r".*\(2 such lines\)$"):
        reader.read_dispatch([f], "t", verdict=True)
    assert capsys.readouterr().err == ""
    assert len(reader.read_dispatch([f], "t")) == 1
    assert "skipped 2 malformed lines: " in capsys.readouterr().err


FILES = [
    (lambda p: None, "no such file"),
    (lambda p: os.symlink(str(p) + ".gone", p), "no such file (a symbolic link to a missing file)"),
    (lambda p: p.mkdir(), "is a directory, not a regular file"),
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: p.write_bytes(GOOD.decode().encode("utf-16")), "UTF-16 text, not UTF-8 (save it as UTF-8)"),
    (lambda p: p.write_bytes(b""), "no moebench.dispatch records (it is empty)"),
    (lambda p: p.write_bytes(b"\n \n\t\n"), "no moebench.dispatch records (it is empty)"),
    (lambda p: p.write_text(json.dumps({"schema": "moebench.check/1", "results": []}, indent=1)),
     "no moebench.dispatch records (it holds 1 moebench.check report, not moebench.dispatch records)"),
    (lambda p: p.write_text(json.dumps({"results": [{"details": {}}]}) + "\n" + json.dumps({"results": []})),
     ("no moebench.dispatch records, bandwidth rows or moebench.check reports (it holds only 2 moebench.check "
      "reports with no bandwidth rows)")),
    (lambda p: p.write_text('{"schema": "moebench.permute/1"}\n{"tool": "moebench.permute"}\n{"a": 1}\n'),
     ("no moebench.dispatch records (it holds 2 moebench.permute records, 1 object of no known kind, not "
      "moebench.dispatch records)")),
]


@pytest.mark.parametrize("make, why", FILES, ids=[why for _, why in FILES])
def test_a_file_that_is_no_file_of_records_is_refused_by_name(tmp_path, make, why):
    p = tmp_path / "in.jsonl"
    make(p)
    kinds = ("dispatch", "row", "check") if "bandwidth rows" in why else ("dispatch",)
    with pytest.raises(RecordError) as e:
        reader.read([p], "t", kinds)
    assert str(e.value) == f"{p}: {why}"


def test_a_byte_order_mark_and_one_document_over_many_lines_read(tmp_path, capsys):
    f = write(tmp_path, b"\xef\xbb\xbf" + GOOD, GOOD)
    assert [r["_line"] for r in reader.read_dispatch([f], "t")] == [1, 2]
    doc = tmp_path / "one.json"
    doc.write_bytes(b"\xef\xbb\xbf" + json.dumps(rec(), indent=2).encode())
    assert [r["_line"] for r in reader.read_dispatch([doc], "t")] == [1]
    assert capsys.readouterr().err == ""


def test_need_names_the_workload_keys_a_tool_reads(tmp_path):
    f = write(tmp_path, changed("workload", {"num_tokens": 8, "hidden": 16, "topk": 2, "dtype": "bf16"}))
    with pytest.raises(RecordError, match="workload.num_experts is missing"):
        reader.read_dispatch([f], "t")
    assert len(reader.read_dispatch([f], "t", need=("num_tokens", "hidden", "topk", "dtype"))) == 1


def test_every_committed_result_reads_clean(capsys):
    """The validator refuses nothing a real run wrote (GPU, shared-GPU, overlap, graph-view records)."""
    files = sorted((ROOT / "bench" / "results").glob("*.jsonl"))
    n = sum(len(reader.read([f], "t", kinds=("dispatch", "row", "check"), verdict=True, require=False))
            for f in files)
    checks = sum(len(reader.read([f], "t", kinds=("check",), verdict=True, require=False))
                 for f in sorted((ROOT / "bench" / "results").glob("check-*.json")))
    assert n > 50 and checks > 0 and capsys.readouterr().err == ""


def test_a_view_that_says_why_it_has_no_figure_gives_none():
    """A view holding `none` or `fail` is no timing, whatever else it holds (its samples once made a verdict)."""
    for why in ("none", "fail"):
        r = rec(views={"cached": {why: "x", "samples_us": [math.nan, -5.0]}, "graph": {"us": 9.0}})
        assert schema.view_timing(r, "cached") is None and schema.view_us(r, "cached") is None
        assert schema.view_us(r, "graph") == 9.0 and validate.dispatch_problem(r) is None


@pytest.mark.parametrize("row, why", [
    ({"workload": "p2p", "backend": "x", "phase": "0->1", "GBps": math.nan}, "GBps is NaN"),
    ({"workload": "p2p", "backend": "x", "phase": "0->1", "GBps": 0}, "GBps is 0"),
    ({"workload": "p2p", "backend": "x", "phase": "0->1", "GBps": -1.5}, "GBps is -1.5"),
    ({"workload": "p2p", "backend": "x", "phase": "0->1", "GBps": 1e308}, "GBps is 1e+308: outside"),
])
def test_the_gate_never_passes_on_an_impossible_row(tmp_path, row, why):
    """A baseline row (rows JSONL or a check report) is refused; this run's own row FAILs the gate."""
    rows = write(tmp_path, json.dumps(row).encode(), name="rows.jsonl")
    report = tmp_path / "check.json"
    report.write_text(json.dumps({"schema": "moebench.check/1", "results": [{"details": {"rows": [row]}}]}, indent=1))
    for f, line in ((rows, f"{rows}:1: "), (str(report), f"{report}:1: results[0].details.rows[0].")):
        with pytest.raises(RecordError, match="^" + re.escape(line + why)):
            baseline.read_rows(f)
    good = write(tmp_path, json.dumps({**row, "GBps": 100.0}).encode(), name="good.jsonl")
    opts = type("Options", (), {"baseline": good, "results": None, "threshold": 10.0})()
    ctx = Context(opts, [Result("p2p", "PASS", "", {"rows": [row]}, 0.0)])
    out = baseline.check_baseline(ctx)
    assert out.status == "FAIL" and why in out.summary and "-inf" not in out.summary


def test_a_zero_or_negative_median_never_wins_in_memory():
    """ab refuses what the reader would have: records built in memory skip the reader."""
    recs = [rec("alltoall", "dispatch", 500.0), rec("alltoall", "combine", 500.0),
            rec("deepep", "dispatch", 300.0), rec("deepep", "combine", 300.0)]
    assert ab.decide(recs, version="0.19.2")["winner"] == "deepep"
    for bad in (0.0, -300.0, math.nan):
        recs[2]["timing"].update(median_us=bad, p10_us=bad, p90_us=bad)
        d = ab.decide(recs, version="0.19.2")
        assert d["winner"] == "alltoall" and "REFUSED" in d["reason"], d["reason"]


SWEEP_FILES = [
    ("a.json", b"[1, 2]", "holds a JSON list, not an object of sweep settings"),
    ("a.json", b"null", "holds null, not an object"),
    ("a.json", b'{"hidden": 1}\n{"hidden": 2}\n', "more than one JSON value (the second at line 2"),
    ("a.json", b"[" * 100000, "nested too deeply to read"),
    ("a.toml", b"a = " + b"[" * 5000 + b"]" * 5000, "nested too deeply to read"),
    ("a.json", b'{"hidden": ' + b"9" * 5000 + b"}", "a number too long to read"),
    ("a.toml", b"hidden = " + b"9" * 5000, "a number too long to read"),
    ("a.json", b'{"hidden": 1' + b"0" * 3999 + b', "num_experts": 8, "topk": 2, "num_tokens": 8}',
     "hidden must be an integer up to 2^63-1 (or a list of them), got a 4000-digit integer"),
    ("a.toml", b"hidden = 64\n# caf\xe9\n", "a.toml:2: not UTF-8 text"),
    ("a.toml", b"hidden = [", "not TOML"),
    ("a.json", b'{"hidden": 8, "num_experts": 8, "topk": 2, "num_tokens": 8, "knobs": {"deepep": {"num_sms": {}}}}',
     "[knobs.deepep] num_sms: a JSON object is no knob value"),
    ("a.json", b'{"hidden": 8, "num_experts": 8, "topk": 2, "num_tokens": 8, "description": 5}',
     "description must be a string"),
    ("fifo.toml", None, "is a FIFO (named pipe), not a regular file"),
    ("dir.toml", None, "is a directory, not a regular file"),
    ("gone.toml", None, "gone.toml: no such file"),
]


@pytest.mark.parametrize("name, content, why", SWEEP_FILES, ids=[why for _, _, why in SWEEP_FILES])
def test_a_bad_sweep_file_is_one_line(tmp_path, name, content, why):
    p = tmp_path / name
    if content is not None:
        p.write_bytes(content)
    elif name.startswith("fifo"):
        os.mkfifo(p)
    elif name.startswith("dir"):
        p.mkdir()
    with pytest.raises(WorkloadError) as e:
        sweep.load(str(p))
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_sweep_file_with_a_byte_order_mark_loads(tmp_path):
    for name, text in (("s.toml", 'hidden = 64\nnum_experts = 8\ntopk = 2\nnum_tokens = [16, 32]\n'),
                       ("s.json", '{"hidden": 64, "num_experts": 8, "topk": 2, "num_tokens": [16, 32]}')):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert sweep.load(str(tmp_path / name)).axes["num_tokens"] == [16, 32]


# ---- the tools, as a user runs them ----------------------------------------------------------------

def tool(*argv, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def refused(p: subprocess.CompletedProcess, *phrases: str) -> str:
    """Exit 2 with one stderr line holding every phrase, and no traceback."""
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert all(x in err[0] for x in phrases), err
    return err[0]


def pair(name: str, us: float) -> list[bytes]:
    """alltoall's dispatch and combine at 500 us, then `name`'s at `us`, as JSONL lines."""
    return [json.dumps(rec(b, phase, t)).encode() for b, t in (("alltoall", 500.0), (name, us))
            for phase in ("dispatch", "combine")]


def test_no_tool_judges_what_is_left_of_a_damaged_a_b(run_tool, tmp_path):
    """`megatron flags` printed flags from the records left after skipping a line it could not read, and exited
    0 (issue 50): each tool that judges refuses the file instead, naming the first bad line; report's tables
    still show the rest."""
    lines = pair("deepep", 400.0)
    good = write(tmp_path, *lines, name="a.jsonl")
    damaged = write(tmp_path, *lines[:2], b'"a string"', *lines[2:], b"{cut", name="b.jsonl")
    why = f"{damaged}:3: 'a string', not a record object; refused: "
    flags = ["flags", "--results", damaged, "--megatron-core-version", "0.19.2"]
    for prog, argv in (("moebench.megatron flags", flags),
                       ("moebench.report", ["--compare", good, damaged]),
                       ("moebench.plan", ["--ep", "8", "--results", damaged]),
                       ("moebench.check", ["-t", "baseline", "--baseline", damaged])):
        p = run_tool(prog.split()[0], *argv)
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, (prog, p)
        assert p.stderr.startswith(f"{prog}: error: ") and why in p.stderr and "(2 such lines)" in p.stderr, p.stderr
    p = run_tool("moebench.report", damaged)
    assert p.returncode == 0 and "skipped 2 malformed lines" in p.stderr


def test_cli_no_tool_judges_an_impossible_median(tmp_path):
    """A deepep dispatch median of 0, -5 or NaN would win any A/B it entered: each tool that judges refuses
    the file, naming the line and the figure; report's tables skip the record and say so."""
    good = write(tmp_path, *pair("deepep", 400.0), name="a.jsonl")
    files = {}
    for bad in (0.0, -5.0, math.nan):
        lines = pair("deepep", 400.0)
        r = rec("deepep", "dispatch", 400.0)
        r["timing"].update(median_us=bad, p10_us=bad, p90_us=bad, samples_us=[bad] * 5)
        r["traffic"]["algbw_GBps"] = bad
        lines[2] = json.dumps(r).encode()
        files[bad] = (write(tmp_path, *lines, name=f"b{len(files)}.jsonl"),
                      f"timing.median_us is {validate.show(bad)}: not a finite number > 0")
    (zero, why0), (neg, why_neg), (nan, why_nan) = files.values()
    refused(tool("moebench.report", "--compare", good, zero), "moebench.report: error:", f"{zero}:3: {why0}",
            "refused")
    refused(tool("moebench.megatron", "flags", "--results", neg, "--megatron-core-version", "0.19.2"),
            "moebench.megatron flags: error: --results", f"{neg}:3: {why_neg}")
    refused(tool("moebench.check", "-t", "baseline", "--baseline", nan), "moebench.check: error: --baseline",
            f"{nan}:3: {why_nan}")
    p = tool("moebench.report", nan)
    assert p.returncode == 0 and "Traceback" not in p.stderr and f"{nan}:3 ({why_nan})" in p.stderr
    shown = [(r[1], r[3]) for r in (line.split() for line in p.stdout.splitlines()) if len(r) > 3]
    assert ("deepep", "combine") in shown and ("deepep", "dispatch") not in shown


def test_cli_malformed_records_across_the_tools(tmp_path):
    """Shapes no record has: refused with the file and line when nothing else is there, skipped and counted
    when the rest is usable; a FIFO, a missing file and a wrong sweep file named as what they are."""
    only_bad = write(tmp_path, b"[1, 2]", b"null", b"[" * 100000, name="bad.jsonl")
    refused(tool("moebench.megatron", "flags", "--results", only_bad, "--megatron-core-version", "0.19.2"),
            f"{only_bad}: no usable moebench.dispatch records: {only_bad}:1: a JSON list, not a record", "2 more")
    refused(tool("moebench.plan", "--ep", "8", "--results", only_bad), "moebench.plan: error: --results",
            f"{only_bad}:1: a JSON list")
    mixed = write(tmp_path, b"\xef\xbb\xbf" + GOOD, b'{"workload": {"num_tokens": ' + b"9" * 5000 + b"}}",
                  changed("workload", "T4096"), b"caf\xe9", name="mixed.jsonl")
    p = tool("moebench.report", mixed, "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr and len(json.loads(p.stdout)) == 1
    assert p.stderr.count("\n") == 1 and f"skipped 3 malformed lines: {mixed}:2 (a number too long" in p.stderr
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    refused(tool("moebench.report", str(fifo), timeout=30), f"{fifo}: is a FIFO (named pipe)")
    refused(tool("moebench.report", "--compare", str(tmp_path / "gone.jsonl"), mixed), "gone.jsonl: no such file")
    sw = tmp_path / "sweep.json"
    sw.write_text('["hidden", 64]')
    refused(tool("moebench.dispatch", "--sweep", str(sw), "--device", "cpu"), "holds a JSON list, not an object")


def test_cli_a_resumed_sweep_skips_what_it_cannot_read(tmp_path):
    """--out holding damage (a BOM, garbage, wrong shapes, an impossible figure, bytes that are not UTF-8, a
    line cut short) resumes: the readable finished case is skipped, the rest runs, the damage is counted."""
    sw = tmp_path / "tiny.toml"
    sw.write_text('hidden = 64\nnum_experts = 8\ntopk = 2\nnum_tokens = [16, 32]\n')
    out = tmp_path / "out.jsonl"
    argv = ("moebench.dispatch", "--sweep", str(sw), "--device", "cpu", "--ep", "2", "--backend", "alltoall",
            "--iters", "1", "--out", str(out))
    first = tool(*argv, "--max-cases", "1")
    assert first.returncode == 0, first.stderr
    done = out.read_bytes().splitlines()
    nan = json.loads(done[1])
    nan["timing"]["median_us"] = math.nan
    out.write_bytes(b"\xef\xbb\xbf" + done[0] + b"\n[1]\nnull\n\xff\xfe\n" + json.dumps(nan).encode() + b"\n"
                    + b"[" * 100000 + b"\n" + done[1][:50])
    p = tool(*argv)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "T=16 EP=2 alltoall: already in" in p.stdout and "ran 1, skipped 1" in p.stdout
    note = [line for line in p.stderr.splitlines() if "malformed" in line]
    assert len(note) == 1 and "skipped 6 malformed lines" in note[0] and f"{out}:2 (a JSON list" in note[0]
