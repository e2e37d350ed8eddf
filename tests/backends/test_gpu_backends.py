"""GPU tier: every backend through the oracle, dispatch and combine, in bf16 and (where the backend carries it)
fp8, at one small shape, as the main job runs them: EP 2, one rank per GPU where two are visible, else two ranks
sharing GPU 0 (functional). A backend whose package is missing here is skipped with its WAIVED reason."""
import json

import pytest
import torch

from moebench import dispatch
from moebench.backends import base

SHAPE = ["--num-tokens", "64", "--hidden", "2048", "--num-experts", "16", "--topk", "4"]   # every backend takes it


def cases():
    for name in base.names():
        for dtype in ("bf16", "fp8"):
            yield pytest.param(name, dtype, id=f"{name}-{dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", list(cases()))
def test_backend_passes_the_oracle(tmp_path, name, dtype):
    cls = base.get(name)
    ok, why = cls.available()
    if not ok:
        pytest.skip(f"{name} WAIVED here: {why}")
    if dtype == "fp8" and not cls.supports_fp8:
        pytest.skip(f"{name} carries bf16 only (refused at parse time with fp8)")
    out = tmp_path / "r.jsonl"
    shared = ["--ranks-per-gpu", "2"] if torch.cuda.device_count() < 2 else []
    rc = dispatch.main(["--device", "cuda", "--ep", "2", *shared, *SHAPE, "--dtype", dtype, "--backend", name,
                        "--views", "api", "--iters", "2", "--warmup-ms", "0", "--timeout", "120", "--out", str(out)])
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 0, [r["check"] for r in recs]
    assert [(r["phase"], r["check"]["status"]) for r in recs if r["phase"] in ("dispatch", "combine")] == [
        ("dispatch", "PASS"), ("combine", "PASS")]
    assert {r["workload"]["dtype"] for r in recs} == {dtype}
