"""Timing views (harness/views/: one module per view, one shape per view), the upstream byte-rule assertion,
host time per phase, the alltoall path's skipped identity sorts, and phases that move no payload."""
import json

import pytest

from moebench import ops
from moebench.backends import base
from moebench.backends.alltoall import AlltoallBackend
from moebench.core.traffic import traffic_of
from moebench.core.workload import Workload, make_routing
from moebench.dispatch import main
from moebench.harness import oracle, views
from moebench.harness.launch import run_ranks
from moebench.harness.runner import RankResult, rank_main
from moebench.harness.spec import RunSpec
from moebench.harness.timing import KernelProfile
from moebench.harness.views import graph, kernel, profile
from moebench.records import dispatch as records

W = Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2)


def rank_pairs(w):
    return traffic_of([make_routing(w, r)[0] for r in range(w.ep)], w).pairs_SD.sum(0).tolist()


RANK_PAIRS = rank_pairs(W)


def run_fake(ctx, name, cls_path, rb):
    base.REGISTRY[name] = cls_path
    return rank_main(ctx, RunSpec(W, (name,), iters=2), name, measure=False, rank_pairs=rb)


def test_a_backend_whose_own_byte_count_differs_fails_the_check():
    outs = run_ranks(run_fake, 2, "cpu", timeout_s=60, args=("test-wrong-bytes", "conftest:WrongBytes", RANK_PAIRS))
    assert {o.status for o in outs} == {"FAIL"}
    assert "byte rule" in outs[0].error and outs[0].phases == {}


def ep_bench_calls(ctx):
    from conftest import EpBenchLoop
    out = run_fake(ctx, "test-ep-bench", "conftest:EpBenchLoop", RANK_PAIRS)
    return out, EpBenchLoop.calls


def test_a_backend_timed_as_ep_bench_pairs_dispatch_and_combine_in_its_cached_view():
    """ep_bench's loop: per iteration dispatch then combine, each timed alone, the first iteration dropped."""
    (out, calls), _ = run_ranks(ep_bench_calls, 2, "cpu", timeout_s=60)
    assert out.status == "PASS", out.error
    cached = {p: out.views[p]["cached"] for p in ("dispatch", "combine")}
    assert all("ep_bench's paired loop" in v["aggregation"] and v["iters"] == 2 for v in cached.values()), cached
    timed = calls[-6:]                   # iters 2 + the first one dropped, after the warm-up's pairs
    assert timed == ["dispatch", "combine"] * 3 and calls[:2] == ["dispatch", "combine"]


def test_host_time_is_never_negative_and_says_when_it_is_within_noise():
    rows = [{"kernel": "k", "us_per_iter": 21.0}]
    split = profile.host_split(20.0, KernelProfile(rows, 21.0))
    assert split["host_us"] is None and split["kernel_busy_us"] == 21.0
    assert split["host_note"].startswith("within noise") and "1.0 us (5.0%) above the api median" in split["host_note"]
    assert profile.host_split(20.0, KernelProfile(rows, 19.5))["host_us"] == 0.5


def test_views_are_found_in_the_package_in_order():
    assert views.VIEWS == ("api", "cached", "kernel", "chained", "graph") and views.SAMPLED == ("api", "cached", "graph")
    assert all(m.ABOUT and m.NAME == n for n, m in views.REGISTRY.items())


def test_cpu_records_carry_every_view_in_one_shape(tmp_path):
    out = tmp_path / "r.jsonl"
    assert main(["--ep", "2", "--num-tokens", "16", "--hidden", "64", "--num-experts", "8", "--topk", "2",
                 "--backend", "alltoall", "--iters", "3", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    for r in recs:
        v = r["views"]
        assert v["api"]["us"] == r["timing"]["median_us"] and v["api"]["samples_us"] == r["timing"]["samples_us"]
        assert v["cached"]["us"] > 0 and v["cached"]["iters"] == 3 and len(v["cached"]["samples_us"]) == 3
        assert v["cached"]["max_over_ranks_us"] >= v["cached"]["us"]
        for name in ("api", "cached"):
            assert {"us", "max_over_ranks_us", "samples_us", "aggregation"} <= set(v[name]), v[name]
        assert "none" in v["kernel"] and "none" in v["graph"]     # CPU: no GPU kernels, no CUDA graphs
        assert v["chained"]["us"] > 0 and len(v["chained"]["samples_us"]) == 3     # free-running pairs on gloo
    assert recs[0]["views"]["chained"] == recs[1]["views"]["chained"]              # one round trip, both phases


def test_comm_kernel_sum_takes_only_named_kernels():
    rows = [{"kernel": "ncclDevKernel_SendRecv", "us_per_iter": 10.0}, {"kernel": "permute_rows", "us_per_iter": 5.0},
            {"kernel": "ncclDevKernel_Reduce", "us_per_iter": 2.5}]
    us, hit = kernel.comm_kernel_us(rows, ("nccl",))
    assert us == 12.5 and hit == ["ncclDevKernel_SendRecv", "ncclDevKernel_Reduce"]
    assert profile.host_split(20.0, KernelProfile(rows, None)) == {
        "kernel_sum_us": 17.5, "kernel_busy_us": None, "library_us": 17.5, "moebench_us": 0.0, "torch_us": 0.0,
        "host_us": 2.5}
    # kernels that overlap (programmatic dependent launches) cover less GPU time than their sum: the host time
    # is what the median holds beyond the time they cover
    assert profile.host_split(20.0, KernelProfile(rows, 15.0))["host_us"] == 5.0


def test_layout_phase_has_no_bytes_and_no_gbps():
    t = traffic_of([make_routing(W, r)[0] for r in range(W.ep)], W)
    timing = {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0}
    res = RankResult("PASS", phases={"dispatch": timing, "layout": timing})
    recs = records.build(RunSpec(W, ("deepep",)), "deepep", True, res, t, None, [], "now")
    by = {r["phase"]: r for r in recs}
    assert "algbw_GBps" in by["dispatch"]["traffic"] and by["dispatch"]["traffic"]["bytes"] > 0
    assert "bytes" not in by["layout"]["traffic"] and "algbw_GBps" not in by["layout"]["traffic"]
    assert "layout" not in records.PAYLOAD_OF


@pytest.mark.parametrize("ep,experts", [(1, 8), (2, 2)])
def test_alltoall_skips_the_identity_chunk_sort(ep, experts, monkeypatch):
    """EP 1, or one local expert per rank: the received chunks are already expert-major."""
    w = Workload(num_tokens=16, hidden=64, num_experts=experts, topk=2, ep=ep, routing="uniform,masked:0.3")
    outs = run_ranks(_count_sorts, ep, "cpu", timeout_s=60, args=(w,))
    assert all(o == (0, "") for o in outs), outs


def test_alltoall_still_sorts_when_chunks_interleave():
    w = Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2)
    outs = run_ranks(_count_sorts, 2, "cpu", timeout_s=60, args=(w,))
    assert all(o[0] > 0 and o[1] == "" for o in outs), outs


def _count_sorts(ctx, w):
    from moebench.core import workload
    calls = []
    real = ops.sort_chunks_by_idxs
    ops.sort_chunks_by_idxs = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        b = AlltoallBackend(knob_values={"ops_impl": "torch"})
        b.setup(ctx.group, w, ctx.device)
        x, idx, wt, q, s = workload.rank_inputs(w, ctx.rank)
        err = oracle.check(b, w, ctx.rank, x, idx, wt, s, ctx.device)[0]
    finally:
        ops.sort_chunks_by_idxs = real
    return len(calls), err


def test_alltoall_cached_view_moves_the_same_rows():
    """The cached dispatch is the permute, the exchange and the sort with the splits known (one permute
    call, no count exchange), giving the api dispatch's rows bit for bit; the cached combine is the api's."""
    for same_rows, same_out, calls in run_ranks(_cached_rows, 2, "cpu", timeout_s=60, args=(W,)):
        assert same_rows and same_out and calls == {"permute": 1, "counts": 0}, calls


def _cached_rows(ctx, w):
    import torch
    import torch.distributed as dist

    from moebench.core import reference, workload
    b = AlltoallBackend(knob_values={"ops_impl": "torch"})
    b.setup(ctx.group, w, ctx.device)
    x, idx, wt, q, s = workload.rank_inputs(w, ctx.rank)
    d = b.dispatch(x, idx, wt)
    y = reference.apply_experts(d.x_RH, d.tokens_per_expert, ctx.rank, w)
    fns = b.cached_phases(x, idx, wt, None, d, y)
    calls = {"permute": 0, "counts": 0}
    real_permute, real_a2a = ops.permute, dist.all_to_all_single
    ops.permute = lambda *a, **k: calls.__setitem__("permute", calls["permute"] + 1) or real_permute(*a, **k)
    dist.all_to_all_single = lambda out, inp, *a, **k: (calls.__setitem__("counts", calls["counts"] + (
        inp.dtype == torch.int64)) or real_a2a(out, inp, *a, **k))
    try:
        dc = fns["dispatch"]()
        out = fns["combine"]()
    finally:
        ops.permute, dist.all_to_all_single = real_permute, real_a2a
    return torch.equal(dc.x_RH, d.x_RH), torch.equal(out, b.combine(y, d.handle)), calls


def test_graph_phase_spans_pair_each_calls_marks():
    """Four marks per captured pair (dispatch start, end, combine start, end; the between step and the
    L2 flush lie outside them): each phase's spans are its own marks, in capture order."""
    marks = list(range(12))
    spans = graph.phase_spans(marks)
    assert spans == {"dispatch": [(0, 1), (4, 5), (8, 9)], "combine": [(2, 3), (6, 7), (10, 11)]}
    with pytest.raises(AssertionError):
        graph.phase_spans(marks[:-1])


def test_kernels_are_told_apart_by_owner():
    """The api split (library / moebench / torch): moebench's CUDA and Triton kernels by name, torch's kernels and
    copies whoever queued them, the rest the library's; TE's Triton `_unpermute_kernel` is not moebench's."""
    own = {"void (anonymous namespace)::permute_rows_kernel<false, true>((anonymous namespac": "moebench",
           "_unpermute": "moebench", "moebench::permute": "moebench", "_unpermute_kernel": "library",
           "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::nati": "torch",
           "void at::native::index_elementwise_kernel<128, 4, at::native::index_copy_kernel_": "torch",
           "Memcpy DtoH (Device -> Pageable)": "torch", "nccl_ep_jit_ht_combine_kernel": "library",
           "void deep_ep::elastic::dispatch_impl<true, true, false, 132, 4, 15, 1, 14336, 0,": "library"}
    assert {k: profile.owner(k) for k in own} == own
    rows = [{"kernel": k, "us_per_iter": float(i + 1)} for i, k in enumerate(own)]
    assert profile.split(rows) == {"library_us": 4 + 8 + 9, "moebench_us": 1 + 2 + 3, "torch_us": 5 + 6 + 7}


def test_moebench_kernel_names_match_its_sources():
    """ops.CUDA_KERNELS are the extension's __global__ functions; ops.TRITON_KERNELS the @triton.jit functions a
    launch names (the others are helpers the kernels call)."""
    import re
    from pathlib import Path

    import moebench
    from moebench import ops
    root = Path(moebench.__file__).parent
    cuda = "".join(p.read_text() for p in (root / "csrc").glob("*.cu*"))
    assert set(ops.CUDA_KERNELS) == set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(",
                                                   cuda))
    triton = (root / "ops" / "triton_kernels.py").read_text()
    jit = set(re.findall(r"@triton\.jit\s*\ndef (\w+)", triton))
    helpers = {f for f in jit if re.search(rf"[^f]\b{f}\(", triton.replace(f"def {f}(", ""))}
    assert set(ops.TRITON_KERNELS) == jit - helpers and helpers == {"_copy_probs", "_copy_scales", "_slot_rows"}
