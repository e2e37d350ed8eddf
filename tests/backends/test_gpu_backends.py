"""GPU tier: every backend through the oracle, dispatch and combine, in bf16 and (where the backend carries it)
fp8, at one small shape, as the main job runs them: EP 2, one rank per GPU where two are visible, else two ranks
sharing GPU 0 (functional). A backend whose package is missing here is skipped with its WAIVED reason, unless
MOEBENCH_EXPECT_BACKENDS names it (the device scripts set it where they put the packages there): then WAIVED fails.

DeepEP V1 (branch hybrid-ep) and V2 share the package name deep_ep, so one process holds one of them: where
MOEBENCH_DEEPEP_V2_PATH names a DeepEP V2 build, deepep-v2 runs in a child process with that build first on its
path (the NCCL it needs is the process's, env/nccl.py)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from moebench import dispatch
from moebench.backends import base

SHAPE = ["--num-tokens", "64", "--hidden", "2048", "--num-experts", "16", "--topk", "4"]   # every backend takes it
EXPECT = [n for n in os.environ.get("MOEBENCH_EXPECT_BACKENDS", "").split(",") if n]
V2_PATH = os.environ.get("MOEBENCH_DEEPEP_V2_PATH", "")
MODES = {"ncclep": [["mode=ht"], ["mode=ht", "zero_copy=0"], ["mode=ll"]]}   # each mode (and ht's zero copy) a case


def cases():
    for name in base.names():
        for knobs in MODES.get(name, [[]]):
            for dtype in ("bf16", "fp8"):
                tags = (k.split("=")[1] if k.startswith("mode=") else k.replace("=", "") for k in knobs)
                yield pytest.param(name, dtype, knobs, id="-".join([name, *tags, dtype]))


def run(name: str, argv: list[str]) -> int:
    """The main job, in this process, or for deepep-v2 with a V2 build named, in a child with it first on the path."""
    if name != "deepep-v2" or not V2_PATH:
        return dispatch.main(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([V2_PATH, *sys.path])}
    return subprocess.run([sys.executable, "-m", "moebench.dispatch", *argv], env=env, timeout=300).returncode


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,knobs", list(cases()))
def test_backend_passes_the_oracle(tmp_path, name, dtype, knobs):
    cls = base.get(name)
    ok, why = cls.available()
    if not ok and not (name == "deepep-v2" and V2_PATH):
        assert name not in EXPECT, f"{name} is expected here (MOEBENCH_EXPECT_BACKENDS) but WAIVED: {why}"
        pytest.skip(f"{name} WAIVED here: {why}")
    if dtype == "fp8" and not cls.supports_fp8:
        pytest.skip(f"{name} carries bf16 only (refused at parse time with fp8)")
    out = tmp_path / "r.jsonl"
    shared = ["--ranks-per-gpu", "2"] if torch.cuda.device_count() < 2 else []
    rc = run(name, ["--device", "cuda", "--ep", "2", *shared, *SHAPE, "--dtype", dtype, "--backend", name,
                    *(a for k in knobs for a in ("--knob", k)), "--views", "api", "--iters", "2", "--warmup-ms", "0",
                    "--timeout", "120", "--out", str(out)])
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    waived = [r["check"].get("error") for r in recs if r["check"]["status"] == "WAIVED"]
    if waived and name not in EXPECT:
        pytest.skip(f"{name} WAIVED here: {waived[0]}")
    assert rc == 0, [r["check"] for r in recs]
    assert [(r["phase"], r["check"]["status"]) for r in recs if r["phase"] in ("dispatch", "combine")] == [
        ("dispatch", "PASS"), ("combine", "PASS")]
    assert {r["workload"]["dtype"] for r in recs} == {dtype}
