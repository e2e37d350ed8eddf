"""The timing-view hooks of deepep, deepep-ll and hybridep against the oracle, on CPU/gloo ranks with
the simulated DeepEP/HybridEP (tests/fakes/deep_ep, FAKE_DEEP_EP_CTOR=sim): the `cached` callables
return the checked dispatch's grouped rows and the oracle's combine, and call of DeepEP/HybridEP only what
the upstream tests time (no layout, no metadata pass, no host sync);
native_bytes equals moebench's byte rule; the low-latency combine buffer is allocated once;
HybridEP's NVLink domain is the buffer's."""
import math

import pytest
import torch

from conftest import FAKES, ROOT, SMALL
from moebench.backends import get
from moebench.core import reference, traffic, workload
from moebench.core.workload import Workload
from moebench.harness.launch import run_ranks
from moebench.harness.oracle import check, grouped


@pytest.fixture
def sim(monkeypatch, tmp_path):
    """The simulated deep_ep on the rank processes' path (the ranks take their launch's sys.path and environment)."""
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"          # HybridEP's JIT check only looks for the file
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setenv("FAKE_DEEP_EP_CTOR", "sim")
    monkeypatch.setenv("CUDA_HOME", str(nvcc.parent.parent))
    for var in ("NVSHMEM_QP_DEPTH", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "FAKE_HYBRID_EP_DETECTED"):
        monkeypatch.delenv(var, raising=False)


def run_views(ctx, cases):
    """Per case: oracle check, the cached views' results and calls, native bytes, knobs."""
    out = []
    for w, name, knobs in cases:
        b = get(name)(knob_values={"ops_impl": "torch", **knobs})
        b.validate(w, ctx.world)
        b.setup(ctx.group, w, ctx.device)
        x, idx, wt, q, s = workload.rank_inputs(w, ctx.rank)
        payload = q if q is not None else x
        err, d, y = check(b, w, ctx.rank, payload, idx, wt, s, ctx.device)
        views = b.cached_phases(payload, idx, wt, s, d, y)
        before, syncs = len(b.buffer.calls), getattr(b.buffer, "host_syncs", 0)
        rows = grouped(views["dispatch"]()).x_RH    # the api dispatch's rows, bit for bit: the same data movement
        comb = views["combine"]()
        comb2 = views["combine"]()                      # repeatable, as a timer calls it
        expected = reference.expected_combine(payload, idx, wt, w, s)
        out.append({"check": err, "rows_equal": torch.equal(rows.view(torch.uint8), grouped(d).x_RH.view(torch.uint8)),
                    "combine": reference.check_combine(comb, expected) or reference.check_combine(comb2, expected),
                    "calls": b.buffer.calls[before:], "host_syncs": getattr(b.buffer, "host_syncs", 0) - syncs,
                    "native": b.native_bytes(d), "knobs": b.knobs(),
                    "buffer_options": getattr(b.buffer, "experimental", None)})
        b.teardown()
    return out


def rule_bytes(w, rank):
    t = traffic.traffic_of([workload.make_routing(w, r)[0] for r in range(w.ep)], w)
    return int(t.per_rank()["pairs"][rank]) * w.bytes_per_token


def small(**kw):
    return Workload(**{**dict(num_tokens=16, hidden=256, num_experts=8, topk=3, ep=2, seed=4), **kw})


CALLS = {("deepep", None): ["dispatch(handle)", "combine", "combine"],           # one dispatch, two combines
         ("hybridep", "permute"): ["dispatch_with_permute(handle)", "combine_with_unpermute", "combine_with_unpermute"],
         ("hybridep", "plain"): ["dispatch(handle)", "combine", "combine"]}


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.slow
def test_deepep_and_hybridep_cached_views_and_native_bytes(sim, ep):
    cases = [(small(ep=ep, routing="uniform,masked:0.2"), "deepep", {}), (small(ep=ep, dtype="fp8"), "deepep", {}),
             (small(ep=ep), "hybridep", {"mode": "permute"}), (small(ep=ep, dtype="fp8", hidden=512), "hybridep", {"mode": "plain"})]
    results = run_ranks(run_views, ep, "cpu", 240, args=(cases,))
    for rank, per_rank in enumerate(results):
        for (w, name, knobs), r in zip(cases, per_rank):
            label = f"{name} {knobs} {w.dtype} rank {rank}"
            assert r["check"] == "" and r["combine"] == "" and r["rows_equal"], (label, r)
            assert r["calls"] == CALLS[(name, knobs.get("mode"))], label        # no layout, no metadata pass
            assert r["host_syncs"] == 0, label
            assert r["native"] == rule_bytes(w, rank), label


@pytest.mark.slow
def test_hybridep_domain_from_the_buffer_and_default_sms(sim, monkeypatch):
    """HybridEP finds a 2-rank NVLink domain where the hosts say 4: the knobs record the buffer's value. Its kernel
    cache is read (HybridEPBuffer's load_cached_kernels) only where the knob asks."""
    monkeypatch.setenv("FAKE_HYBRID_EP_DETECTED", "2")
    w = small(ep=4, num_experts=16, gpus_per_node=4)
    cases = [(w, "hybridep", {"mode": "plain"}),
             (w, "hybridep", {"mode": "permute", "num_sms": 16, "load_cached_kernels": 1})]
    r0 = run_ranks(run_views, 4, "cpu", 240, args=(cases,))[3]
    assert all(r["check"] == "" and r["combine"] == "" for r in r0), r0
    assert r0[0]["knobs"]["ranks_per_nvlink_domain"] == 2 and r0[0]["knobs"]["ranks_per_nvlink_domain_predicted"] == 4
    assert r0[0]["knobs"]["num_sms"] == 8                  # HybridEP's default across 2 domains
    assert r0[1]["knobs"]["num_sms"] == 16
    assert r0[0]["buffer_options"] == {} and "load_cached_kernels" not in r0[0]["knobs"]
    assert r0[1]["buffer_options"] == {"load_cached_kernels": True} and r0[1]["knobs"]["load_cached_kernels"] == 1


@pytest.mark.slow
def test_low_latency_views_buffer_once_and_qp_depth(sim):
    """deepep-ll: cached views correct; at T 512 moebench sets NVSHMEM_QP_DEPTH to 2 (T + 1) before the
    Buffer (the fake asserts it as DeepEP main does)."""
    depths = []
    for w in (small(hidden=2048, routing="uniform,masked:0.2"), small(hidden=2048, num_tokens=512, topk=2)):
        # one launch each: Buffer leaves NVSHMEM_QP_DEPTH set in its process
        for (r,) in run_ranks(run_views, 2, "cpu", 240, args=([(w, "deepep-ll", {})],)):
            assert r["check"] == "" and r["combine"] == "" and r["rows_equal"], r
            assert r["calls"] == ["low_latency_dispatch"] + ["low_latency_combine"] * 2 and r["native"] is None
            depths.append(r["knobs"]["nvshmem_qp_depth"])
    assert depths == [1024, 1024, 1026, 1026]


def ll_expert_slots(ctx, w):
    b = get("deepep-ll")(knob_values={"ops_impl": "torch"})
    b.setup(ctx.group, w, ctx.device)
    x, idx, wt, _, _ = workload.rank_inputs(w, ctx.rank)
    b.combine_in.fill_(math.nan)                    # every slot garbage: the experts must write what the kernel reads
    err, d, y = check(b, w, ctx.rank, x, idx, wt, None, ctx.device)
    again = reference.check_combine(b.combine(y, d.handle), reference.expected_combine(x, idx, wt, w))
    return err, again, d.slots and y.data_ptr() == b.combine_in.data_ptr(), int(torch.isnan(b.combine_in).any())


def test_low_latency_experts_write_the_slots_combine_reads(sim):
    """deepep-ll hands its slots to the experts as they are; they write into the buffer low_latency_combine reads
    (no copy in combine), and only the received slots: no [E*T, H] zero-fill per call."""
    for err, again, same, garbage_left in run_ranks(ll_expert_slots, 2, "cpu", 240, args=(small(hidden=2048),)):
        assert err == "" and again == "" and same
        assert garbage_left


@pytest.mark.slow
def test_dispatch_cli_runs_the_simulated_backends(sim, tmp_path):
    """End to end through `python -m moebench.dispatch`: PASS, the runner's byte-rule assertion made, cached
    views timed, the upstream byte figures in every payload phase's record."""
    import os
    import subprocess
    import sys


    from moebench.records.reader import read_objects as read
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{FAKES}{os.pathsep}{ROOT}"}
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", *SMALL, "--hidden", "2048", "--backend",
                        "deepep,deepep-ll,hybridep", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    recs = read(out)
    assert {r["backend"]["name"] for r in recs} == {"deepep", "deepep-ll", "hybridep"}
    for r in recs:
        assert r["check"]["status"] == "PASS", r["check"]
        if r["phase"] == "layout":
            continue
        assert r["traffic"]["upstream"]["deepep_ll_bytes"] > 0 and "deepep_rdma_bytes" not in r["traffic"]["upstream"]
        assert r["views"]["cached"]["us"] > 0, r["views"]
        if r["phase"] == "dispatch" and r["backend"]["name"] != "deepep-ll":
            nb = r["check"]["native_bytes"]
            assert nb["backend"] == nb["expected"] > 0 and nb["rule"] == "moebench/1"
