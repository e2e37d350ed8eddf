"""GPU tier: the NCCL path of the main job on one GPU (EP 1), and on several when present."""
import pytest
import torch

from moebench import dispatch
from moebench.records.schema import read as read_records


def run(tmp_path, *argv):
    out = tmp_path / "r.jsonl"
    rc = dispatch.main(["--device", "cuda", "--backend", "alltoall", "--iters", "5", "--warmup-ms", "20",
                        "--out", str(out), *argv])
    return rc, read_records(out)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_nccl_path_ep1_passes_the_oracle(tmp_path, dtype):
    rc, recs = run(tmp_path, "--ep", "1", "--num-tokens", "1024", "--hidden", "2048",
                   "--num-experts", "64", "--dtype", dtype)
    assert rc == 0
    assert {r["check"]["status"] for r in recs} == {"PASS"}
    assert all(r["timing"]["timer"] == "cuda-event" and r["timing"]["median_us"] > 0 for r in recs)
    assert all(r["traffic"]["busbw_GBps"] == 0 for r in recs)     # one rank: nothing crosses a link
    assert recs[0]["env"]["gpu"] and recs[0]["env"]["nccl"]


@pytest.mark.multigpu
def test_nccl_path_all_gpus(tmp_path):
    n = torch.cuda.device_count()
    rc, recs = run(tmp_path, "--ep", str(n), "--num-tokens", "1024", "--hidden", "2048",
                   "--num-experts", str(8 * n))
    assert rc == 0 and {r["check"]["status"] for r in recs} == {"PASS"}
    assert all(r["traffic"]["busbw_GBps"] > 0 for r in recs)
    assert recs[0]["traffic"]["measured_ceiling_GBps"] > 0
