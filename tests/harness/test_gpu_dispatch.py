"""GPU tier: the NCCL path of the main job on one GPU (EP 1), and on several when present."""
import pytest
import torch

from moebench import dispatch
from moebench.records.reader import read_objects as read_records


def run(tmp_path, *argv):
    out = tmp_path / "r.jsonl"
    rc = dispatch.main(["--device", "cuda", "--backend", "alltoall", "--iters", "5", "--warmup-ms", "20",
                        "--out", str(out), *argv])
    return rc, read_records(out)


@pytest.mark.multigpu
def test_nccl_path_all_gpus(tmp_path):
    n = torch.cuda.device_count()
    rc, recs = run(tmp_path, "--ep", str(n), "--num-tokens", "1024", "--hidden", "2048",
                   "--num-experts", str(8 * n))
    assert rc == 0 and {r["check"]["status"] for r in recs} == {"PASS"}
    assert all(r["traffic"]["busbw_GBps"] > 0 for r in recs)
    assert recs[0]["traffic"]["measured_ceiling_GBps"] > 0


@pytest.mark.gpu
@pytest.mark.alone
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_no_view_is_faster_than_the_kernels_it_must_contain(tmp_path, dtype):
    """Every view of a phase moves the same data, so none can take less time than the GPU time the phase's
    data-moving kernels cover (cached: the permute, the exchange and the sort still run; their union, not
    their sum: the permute's index and copy kernels overlap as dependent launches); the graph view replays
    the cached calls, checked against the oracle, and api - graph is recorded. The NCCL path at EP 1 passes
    the oracle, is timed by CUDA events, and moves nothing over a link."""
    rc, recs = run(tmp_path, "--ep", "1", "--num-tokens", "4096", "--hidden", "7168", "--num-experts", "256",
                   "--dtype", dtype, "--iters", "10")
    assert rc == 0 and {r["check"]["status"] for r in recs} == {"PASS"}, [r["check"] for r in recs]
    assert all(r["timing"]["timer"] == "cuda-event" and r["timing"]["median_us"] > 0 for r in recs)
    assert all(r["traffic"]["busbw_GBps"] == 0 for r in recs)     # one rank: nothing crosses a link
    assert recs[0]["env"]["gpu"] and recs[0]["env"]["nccl"]
    for r in recs:
        busy = r["timing"]["kernel_busy_us"]
        cached, graph = r["views"]["cached"], r["views"]["graph"]
        assert "none" not in graph and graph["mode"].startswith("splits known ahead"), graph
        assert cached["us"] >= 0.95 * busy and graph["us"] >= 0.95 * busy, (r["phase"], busy, cached, graph)
        cold = cached["kernel_busy_us"]            # the cached call's kernels, each behind the L2 flush
        assert cached["us"] >= 0.95 * cold and graph["us"] >= 0.95 * cold, (r["phase"], cold, graph)
        api_graph = r["timing"]["median_us"] - graph["us"]
        assert r["timing"]["api_minus_graph_us"] == pytest.approx(api_graph, abs=1e-3)


@pytest.mark.gpu
@pytest.mark.slow
def test_graph_view_is_none_with_the_reason_on_gloo(tmp_path):
    """Shared-GPU ranks run the exchange on gloo, whose collectives cannot be captured: the view says so."""
    rc, recs = run(tmp_path, "--ep", "2", "--ranks-per-gpu", "2", "--num-tokens", "256", "--hidden", "1024",
                   "--num-experts", "16")
    assert rc == 0 and all("gloo" in r["views"]["graph"]["none"] for r in recs)
