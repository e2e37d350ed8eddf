"""Setup cost in every record and table (harness/setupcost.py): per rank, the process group, the backend's build,
its first dispatch + combine, and with --recreate a destroy and rebuild (then one checked call on the new one)."""
import json
import os

import pytest

from conftest import first_on_path
from moebench.backends import base
from moebench.core.workload import Workload
from moebench.harness.launch import run_ranks
from moebench.harness.runner import rank_main
from moebench.harness.spec import RunSpec
from moebench.records import reader, tables

TINY = ["--device", "cpu", "--ep", "2", "--num-tokens", "16", "--hidden", "64", "--num-experts", "8", "--topk", "2",
        "--iters", "2", "--views", "api"]
PARTS = ("group_ms", "build_ms", "first_dispatch_ms", "first_combine_ms", "first_call_ms", "destroy_ms",
         "recreate_ms", "recreate_first_call_ms")


def test_every_record_holds_each_ranks_setup_and_the_table_its_setup_ms(run_tool, tmp_path):
    out = tmp_path / "r.jsonl"
    p = run_tool("moebench.dispatch", *TINY, "--backend", "alltoall", "--recreate", "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    recs = reader.read_dispatch([str(out)], "test", verdict=True)       # the reader that judges takes the new shape
    s = recs[0]["setup"]
    assert recs[1]["setup"] == s and [r["rank"] for r in s["per_rank"]] == [0, 1]
    for r in s["per_rank"]:
        assert all(isinstance(r[k], float) and r[k] >= 0 for k in PARTS), r
        assert r["first_call_ms"] == pytest.approx(r["first_dispatch_ms"] + r["first_combine_ms"], abs=2e-3)
        assert r["group_ms"] > 0 and r["first_call_ms"] > 0 and r["recreate_first_call_ms"] > 0
    assert s["setup_ms"] == pytest.approx(max(r["build_ms"] + r["first_call_ms"] for r in s["per_rank"]), abs=2e-3)
    assert s["max"]["recreate_ms"] == max(r["recreate_ms"] for r in s["per_rank"])
    head = next(line for line in p.stdout.splitlines() if line.startswith("backend"))
    row = next(line for line in p.stdout.splitlines() if line.startswith("alltoall   dispatch"))
    assert "setup ms" in head and tables.sig3(s["setup_ms"]) in row.split()
    assert "--recreate" in RunSpec.from_argv(recs[0]["argv"]).to_argv()      # the repro command keeps it


def rebuilt(ctx):
    base.REGISTRY["test-rebuild"] = "conftest:WrongAfterRebuild"
    spec = RunSpec(Workload(num_tokens=8, hidden=64, num_experts=4, topk=2, ep=2), ("test-rebuild",), iters=1,
                   views=("api",), recreate=True)
    return rank_main(ctx, spec, "test-rebuild", measure=False)


def test_a_backend_that_comes_back_wrong_from_a_rebuild_fails_after_its_timed_calls():
    outs = run_ranks(rebuilt, 2, "cpu", timeout_s=120)
    assert {o.status for o in outs} == {"FAIL"}
    assert outs[0].error.startswith("after --recreate: combine:"), outs[0].error
    assert outs[0].phases["dispatch"]["median_us"] > 0                  # timed before the rebuild
    assert all(r["recreate_ms"] >= 0 and r["recreate_first_call_ms"] > 0 for r in outs[0].setup)


def test_a_record_without_setup_shows_a_dash_and_setup_ms_is_the_slowest_build_and_first_call():
    from moebench.records.shapes import Setup
    s = Setup.of([{"rank": 0, "build_ms": 5.0, "first_call_ms": 1.0},
                  {"rank": 1, "build_ms": 2.0, "first_call_ms": 7.0}])
    assert s.setup_ms == 9.0 and s.max == {"build_ms": 5.0, "first_call_ms": 7.0}
    rec = {"backend": {"name": "alltoall"}, "phase": "dispatch", "timing": {"median_us": 1.0}, "traffic": {},
           "check": {"status": "PASS"}}
    assert tables.table_rows([rec])[0][-2] == "-" and tables.table_rows([{**rec, "setup": s.asdict()}])[0][-2] == "9.00"
    assert json.loads(json.dumps(s.asdict()))["setup_ms"] == 9.0


@pytest.mark.gpu
@pytest.mark.parametrize("backend", base.names())
def test_every_backend_records_its_setup_at_ep_1(tmp_path, backend):
    """GPU tier: each backend at EP 1 on one GPU with --recreate: build, first call and rebuild ms per rank in its
    records (skipped where it cannot run here: refused or WAIVED, with the reason); deepep-v2 with
    MOEBENCH_DEEPEP_V2_PATH's build first on its ranks' path (at a8e726b it skipped: V1 was found first)."""
    from moebench import dispatch
    out = tmp_path / "r.jsonl"
    with first_on_path(os.environ.get("MOEBENCH_DEEPEP_V2_PATH", "") if backend == "deepep-v2" else ""):
        rc = dispatch.main(["--device", "cuda", "--ep", "1", "--backend", backend, "--num-tokens", "128", "--iters",
                            "3", "--warmup-ms", "20", "--views", "api", "--recreate", "--timeout", "600",
                            "--out", str(out)])
    if rc == 2 or not out.exists():
        pytest.skip(f"{backend} refused at EP 1 on this machine")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    if {r["check"]["status"] for r in recs} == {"WAIVED"}:
        pytest.skip(recs[0]["check"]["error"])
    assert rc == 0 and {r["check"]["status"] for r in recs} == {"PASS"}, [r["check"] for r in recs]
    s = recs[0]["setup"]
    assert s["setup_ms"] > 0 and s["max"]["first_call_ms"] > 0, s
    assert all(k in s["per_rank"][0] for k in PARTS), s
