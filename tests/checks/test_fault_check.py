"""check -t fault.BACKEND (checks/fault.py): one rank killed, then one stalled past the watchdog; PASS when the stack
ends each run in bounded time (the seconds named), FAIL when it hangs; only when named. The GPU tier runs every
backend on ranks sharing one GPU (functional)."""
import json
import os
from pathlib import Path

import pytest

from conftest import alive, first_on_path
from moebench import check
from moebench.backends import base
from moebench.checks import fault as fault_check
from moebench.checks import registry

SMALL = ["--num-tokens", "16", "--hidden", "64", "--num-experts", "8", "--topk", "2"]


def test_fault_checks_run_only_when_named():
    every = [c.key for c in registry.select()]
    assert not any(k.startswith("fault.") for k in every) and "baseline" in every
    assert [c.key for c in registry.select(["fault"])] == [f"fault.{n}" for n in base.names()]


def test_a_hang_past_the_watchdog_is_fail_and_a_backend_that_failed_first_is_no_pass():
    f = {"injected": "kill:1@2", "verdict": "hangs", "after_s": None, "left": [0]}
    rec = {"check": {"status": "FAIL", "error": "injected ..."}, "fault": f}
    out = fault_check.judge("x", "EP 2", [[rec]])
    assert out.status == "FAIL" and "hangs on a dead peer" in out.summary
    early = {"check": {"status": "FAIL", "error": "dispatch: wrong"}, "fault": {**f, "verdict": "not injected"}}
    assert fault_check.judge("x", "EP 2", [[early]]).status == "FAIL"
    waived = {"check": {"status": "WAIVED", "error": "no package"}}
    assert fault_check.judge("x", "EP 2", [[waived]]).status == "WAIVED"


@pytest.mark.slow
def test_alltoall_on_gloo_detects_a_killed_and_a_stalled_peer(tmp_path):
    """The kill: gloo's connection reset, at once; the stall: gloo's own timeout (half the 4 s watchdog)."""
    out = tmp_path / "c.json"
    assert check.main(["-t", "fault.alltoall", "--watchdog", "4", *SMALL, "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"][0]
    kill, stall = res["details"]["faults"]
    assert res["status"] == "PASS" and kill["verdict"].startswith("detects in") and kill["after_s"] < 2, res
    assert stall["injected"] == "stall:1@2:38" and stall["verdict"].startswith("detects in"), stall
    assert 1.5 < stall["after_s"] < 4 and "Timed out" in stall["ranks"][0]["seen"]
    assert not any(alive(x["pid"]) for f in (kill, stall) for x in f["ranks"])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("backend", base.names())
def test_every_backend_ends_a_run_with_a_dead_peer_on_shared_gpu_ranks(tmp_path, backend):
    """GPU tier: each backend at EP 2 (2 ranks sharing GPU 0 where one GPU is visible): no hang, no orphan, the
    seconds recorded; a backend that cannot run here is WAIVED. The check's JSON is kept in MOEBENCH_FAULT_OUT where
    set (the device round's records); deepep-v2 with MOEBENCH_DEEPEP_V2_PATH's build first on its child's path."""
    out = Path(os.environ.get("MOEBENCH_FAULT_OUT") or tmp_path) / f"fault-{backend}.json"
    with first_on_path(os.environ.get("MOEBENCH_DEEPEP_V2_PATH", "") if backend == "deepep-v2" else ""):
        check.main(["-t", f"fault.{backend}", "--watchdog", "8", "--out", str(out)])
    res = json.loads(out.read_text())["results"][0]
    if res["status"] == "WAIVED":
        pytest.skip(res["summary"])
    assert res["status"] == "PASS", res["summary"]
    for f in res["details"]["faults"]:
        assert f["verdict"] != "hangs" and f["after_s"] is not None and f["left"] == [], f
        assert not any(alive(x["pid"]) for x in f["ranks"])