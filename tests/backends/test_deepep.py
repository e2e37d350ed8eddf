"""deepep / deepep-ll without deep_ep: limits, availability, and the grouping/weighting logic
against the oracle (a one-rank simulation where every token is 'received')."""
import sys
import types

import pytest
import torch

from moebench.backends import Unavailable, get
from moebench.backends.deepep import DeepEPBackend, group_by_local_expert, import_deep_ep, unpermuted_rows
from moebench.backends.deepep_ll import DeepEPLowLatencyBackend, ll_buffer_bytes
from moebench.core import reference, workload
from moebench.core.workload import Workload, WorkloadError
from moebench.env.deepep import HINT


def test_registered_and_available_does_not_import():
    assert get("deepep") is DeepEPBackend and get("deepep-ll") is DeepEPLowLatencyBackend
    before = "deep_ep" in sys.modules
    ok, why = DeepEPBackend.available()
    assert ("deep_ep" in sys.modules) == before
    if not ok:
        assert "deep_ep not installed" in why and "hybrid-ep" in why


@pytest.mark.parametrize("world", [1, 3, 6, 12, 24, 48])   # 24: no SWITCH_RDMA_RANKS case; 48: no config
def test_normal_rank_counts(world):
    w = Workload(num_tokens=8, hidden=256, num_experts=48, topk=2, ep=world)
    with pytest.raises(WorkloadError, match="2, 4 or 8"):
        DeepEPBackend().validate(w, world)


def test_normal_limits():
    ok = Workload(num_tokens=8, hidden=256, num_experts=16, topk=2, ep=8)
    DeepEPBackend().validate(ok, 8)
    DeepEPBackend().validate(ok.replace(dtype="fp8"), 8)
    with pytest.raises(WorkloadError, match="multiple of 8"):
        DeepEPBackend().validate(ok.replace(hidden=260), 8)
    with pytest.raises(WorkloadError, match="even"):
        DeepEPBackend(knob_values={"num_sms": 23}).validate(ok, 8)
    w16 = Workload(num_tokens=8, hidden=256, num_experts=16, topk=2, ep=16, gpus_per_node=4)
    with pytest.raises(WorkloadError, match="8 ranks per node"):
        DeepEPBackend().validate(w16, 16)


def test_ll_limits():
    ok = Workload(num_tokens=128, hidden=7168, num_experts=256, topk=8, ep=8)
    DeepEPLowLatencyBackend().validate(ok, 8)
    for bad, msg in ((ok.replace(hidden=1024), "--hidden in"), (ok.replace(hidden=3072), "--hidden in"),
                     (ok.replace(topk=12), "topk <= 11"),
                     (ok.replace(dtype="fp8"), "fp8"), (ok.replace(num_tokens=4096), "GiB per rank")):
        with pytest.raises(WorkloadError, match=msg):
            DeepEPLowLatencyBackend().validate(bad, 8)
    with pytest.raises(WorkloadError, match="2\\+ ranks"):
        DeepEPLowLatencyBackend().validate(ok.replace(ep=1), 1)
    with pytest.raises(WorkloadError, match="divisible by 4"):        # deep_ep.cpp: (ranks x T) % 4 for its TMA
        DeepEPLowLatencyBackend().validate(ok.replace(num_tokens=127, ep=2), 2)


def test_ll_buffer_bytes_follows_low_latency_layout():
    """csrc/config.hpp LowLatencyLayout at T 128, H 7168, E 256, by hand: dispatch message 16 + 14336,
    combine message 56 x 4 + 14336; send = recv = E x T x 14560; signalling 1024 each; hint rounds up."""
    w = Workload(num_tokens=128, hidden=7168, num_experts=256, topk=8, ep=8)
    total = 2 * (256 * 128 * 14560) * 2 + 2 * 1024
    assert ll_buffer_bytes(w) == (total + 128) // 128 * 128 == 1_908_410_496
    old_estimate = 2 * (128 * 14352 + 256 * 128 * 14352)           # what moebench used to assume
    assert ll_buffer_bytes(w) / old_estimate > 2


def test_ll_qp_depth(monkeypatch):
    """DeepEP leaves NVSHMEM_QP_DEPTH at 1024; main asserts depth >= 2 (T + 1): a smaller one set by the
    user is refused, none set is fine (setup sets it)."""
    w = Workload(num_tokens=512, hidden=7168, num_experts=16, topk=8, ep=2)
    monkeypatch.delenv("NVSHMEM_QP_DEPTH", raising=False)
    DeepEPLowLatencyBackend().validate(w, 2)
    monkeypatch.setenv("NVSHMEM_QP_DEPTH", "1024")
    with pytest.raises(WorkloadError, match="NVSHMEM_QP_DEPTH=1024 is below the 1026"):
        DeepEPLowLatencyBackend().validate(w, 2)
    DeepEPLowLatencyBackend().validate(w.replace(num_tokens=256), 2)
    monkeypatch.setenv("NVSHMEM_QP_DEPTH", "2048")
    DeepEPLowLatencyBackend().validate(w, 2)


def test_hint_says_what_main_serves():
    """DeepEP main 2.x: legacy Buffer (deepep, deepep-ll) yes; EventOverlap for Megatron and HybridEPBuffer no."""
    assert "main" in HINT and "deepep-ll" in HINT and "EventOverlap" in HINT and "HybridEPBuffer" in HINT
    assert "WAIVED" not in HINT and "lacks the legacy Buffer" not in HINT


def test_setup_unavailable_names_the_error(monkeypatch):
    fake = types.ModuleType("deep_ep")
    fake.__version__ = "2.1.0"
    monkeypatch.setitem(sys.modules, "deep_ep", fake)
    with pytest.raises(Unavailable, match=r"deep_ep 2.1.0 has no deep_ep.Buffer.*hybrid-ep"):
        import_deep_ep("Buffer")


@pytest.mark.parametrize("dtype,routing", [("bf16", "uniform"), ("bf16", "zipf:1.2,masked:0.2"), ("fp8", "uniform")])
def test_grouping_and_weighting_match_the_oracle(dtype, routing):
    """One rank holding every expert: recv_idx = topk_idx, recv_w = topk_w. The grouped rows must be the oracle's
    dispatch with their probs, and experts applying those probs + the unweighted unpermute the oracle's combine."""
    w = Workload(num_tokens=64, hidden=256, num_experts=8, topk=3, ep=1, dtype=dtype, routing=routing, seed=3)
    x, idx, wt, q, s = workload.rank_inputs(w, 0)
    payload = q if q is not None else x
    g = group_by_local_expert(payload, idx, wt, w.local_experts, s, impl="torch")
    tpe = [int(c) for c in g.tokens_per_expert]
    exp_rows, exp_scales, exp_probs = reference.expected_dispatch(w, 0, probs=True)
    got_s = reference.split_rows(g.scales_RS, tpe) if g.scales_RS is not None else None
    got = reference.split_rows(g.x_RH, tpe), got_s, exp_rows, exp_scales, 0, w
    assert reference.check_dispatch(*got, reference.split_rows(g.probs_R, tpe), exp_probs) == ""
    y = reference.apply_experts(g.x_RH, tpe, 0, w, g.scales_RS, g.probs_R)
    out = unpermuted_rows(y, g, impl="torch")
    assert reference.check_combine(out, reference.expected_combine(payload, idx, wt, w, s)) == ""
    assert torch.allclose(g.probs_R.sum(), torch.where(idx >= 0, wt, 0.0).sum())
    # experts that leave the probs out give a wrong combine, and so do probs carried to the wrong rows: it can fail
    y1 = reference.apply_experts(g.x_RH, tpe, 0, w, g.scales_RS)
    assert reference.check_combine(unpermuted_rows(y1, g, impl="torch"),
                                   reference.expected_combine(payload, idx, wt, w, s)) != ""
    assert "prob" in reference.check_dispatch(*got, reference.split_rows(g.probs_R.flip(0), tpe), exp_probs)


def test_grouping_two_rank_view():
    """Rank 1 of EP 2: DeepEP gives local ids (global - 4) and -1 for rank 0's experts."""
    w = Workload(num_tokens=32, hidden=128, num_experts=8, topk=3, ep=2, seed=1)
    x, idx, wt, _, _ = workload.rank_inputs(w, 0)
    local = torch.where(idx >= 4, idx - 4, -1)
    keep = (local >= 0).any(1)                         # tokens DeepEP would send to rank 1
    g = group_by_local_expert(x[keep], local[keep], wt[keep], 4, impl="torch")
    assert g.x_RH.shape[0] == int((local >= 0).sum()) and sum(int(c) for c in g.tokens_per_expert) == g.x_RH.shape[0]
    assert torch.equal(g.probs_R.sort().values, wt[local >= 0].sort().values)


@pytest.mark.parametrize("module", ["deep_ep.buffer", "deep_ep.buffers.legacy"])   # hybrid-ep / v1.2.1, main
def test_nvlink_bypass_patches_the_buffers_own_module(monkeypatch, module):
    from moebench.backends.deepep import bypass_nvlink_check
    home = types.ModuleType(module)
    home.check_nvlink_connections = lambda *a, **k: (_ for _ in ()).throw(AssertionError("NVML"))
    Buffer = type("Buffer", (), {"__module__": module})
    pkg = types.ModuleType("deep_ep")
    pkg.Buffer = Buffer
    monkeypatch.setitem(sys.modules, "deep_ep", pkg)
    monkeypatch.setitem(sys.modules, module, home)
    bypass_nvlink_check()
    assert home.check_nvlink_connections(None) is None


def test_comm_kernel_names():
    """The names as torch.profiler shows DeepEP's templated kernels (namespaces from csrc/kernels, hybrid-ep and
    main's deep_ep::legacy): data kernels match, notify/layout kernels and moebench's own do not."""
    normal, ll = DeepEPBackend.comm_kernels, DeepEPLowLatencyBackend.comm_kernels
    hits = lambda names, k: any(n in k for n in names)   # noqa: E731
    for k in ("void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*)",
              "void deep_ep::legacy::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*)",
              "void deep_ep::internode::dispatch<false, 2, 6, 8>(int4*)"):
        assert hits(normal, k) and not hits(ll, k), k
    assert hits(ll, "void deep_ep::internode_ll::dispatch<false, false, 7168>(void*)") and not hits(
        normal, "void deep_ep::internode_ll::dispatch<false, false, 7168>(void*)")
    for k in ("void deep_ep::intranode::notify_dispatch<8>(int const*)", "void deep_ep::intranode::cached_notify_combine<8>",
              "void deep_ep::layout::get_dispatch_layout<256, 32, 8>", "void deep_ep::internode::cached_notify<8>",
              "void deep_ep::internode_ll::clean_low_latency_buffer<32>", "_permute_copy", "_unpermute",
              "void moebench::unpermute_kernel<__nv_bfloat16>", "void permute_copy_kernel<uint4>"):
        assert not hits(normal, k) and not hits(ll, k), k
