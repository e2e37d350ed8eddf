"""mcore-* backends: Megatron-Core's own token dispatchers under moebench's oracle.

CPU tier: availability, input validation, WAIVED without CUDA, and the real dispatcher code run
through the harness on CPU/gloo with the torch.cuda calls emulated (a functional check of the six-
stage driver and of the probs-in-combine contract, not a measurement). GPU tier: the oracle on CUDA.
"""
import importlib.util
import json

import pytest
import torch

from moebench import dispatch
from moebench.backends import base
from moebench.backends.mcore import McoreAlltoallBackend, McoreDeepEPBackend, McoreHybridEPBackend
from moebench.core import reference, workload
from moebench.core.workload import Workload, WorkloadError
from moebench.harness import oracle
from moebench.harness.launch import run_ranks
from moebench.harness.runner import run_backend
from moebench.harness.spec import RunSpec

HAVE_MCORE = importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
needs_mcore = pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core is not installed")
EMULATE = dict(device="cpu", iters=2, warmup_ms=0, knobs={"mcore_cpu_emulation": True})


def test_registered_names():
    assert base.get("mcore-alltoall") is McoreAlltoallBackend
    assert base.get("mcore-deepep") is McoreDeepEPBackend and base.get("mcore-hybridep") is McoreHybridEPBackend
    assert not McoreAlltoallBackend.dedup and McoreDeepEPBackend.dedup and McoreHybridEPBackend.dedup


def test_available_matches_install():
    ok, why = McoreAlltoallBackend.available()
    assert ok == HAVE_MCORE and (ok or "megatron-core" in why)
    if HAVE_MCORE and importlib.util.find_spec("deep_ep") is None:
        ok, why = McoreHybridEPBackend.available()
        assert not ok and "deep_ep" in why


def test_validate_refuses_what_megatron_cannot_take():
    w1 = Workload(num_tokens=64, hidden=256, num_experts=8, topk=2, ep=1)
    with pytest.raises(WorkloadError, match="ep >= 2"):
        McoreDeepEPBackend().validate(w1, 1)
    with pytest.raises(WorkloadError, match="ep >= 2"):
        McoreHybridEPBackend().validate(w1, 1)
    McoreAlltoallBackend().validate(w1, 1)
    with pytest.raises(WorkloadError, match="masked"):
        McoreAlltoallBackend().validate(w1.replace(routing="uniform,masked:0.1"), 1)
    with pytest.raises(WorkloadError, match="fp8"):
        McoreAlltoallBackend().validate(w1.replace(dtype="fp8"), 1)
    McoreDeepEPBackend().validate(w1.replace(ep=2), 2)


@needs_mcore
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_waived_without_cuda():
    w = Workload(num_tokens=32, hidden=128, num_experts=4, topk=2, ep=1)
    r = run_backend(RunSpec(w, ("mcore-alltoall",), device="cpu", iters=1), "mcore-alltoall", measure=False)
    assert r.status == "WAIVED" and "CUDA" in r.error


@needs_mcore
@pytest.mark.parametrize("ep,E,K,routing", [(1, 8, 2, "uniform"), (2, 8, 4, "zipf:1.2")])
@pytest.mark.slow
def test_emulated_dispatcher_passes_oracle(ep, E, K, routing):
    w = Workload(num_tokens=64, hidden=256, num_experts=E, topk=K, ep=ep, routing=routing)
    r = run_backend(RunSpec(w, ("mcore-alltoall",), **EMULATE), "mcore-alltoall", measure=False)
    assert r.status == "PASS", r.error
    assert r.knobs["dispatcher_class"] == "MoEAlltoAllTokenDispatcher"
    assert set(r.phases) == {"dispatch", "combine"}


def _probs_matter(ctx, w):
    """Experts applying the permuted probs Megatron's dispatch hands out, then Megatron's unweighted combine, match the
    oracle (twice: the handle restores state); experts that leave them out do not."""
    b = McoreAlltoallBackend(knob_values={"mcore_cpu_emulation": True})
    b.setup(ctx.group, w, ctx.device)
    x, idx, wt, _, _ = workload.rank_inputs(w, ctx.rank)
    d = b.dispatch(x, idx, wt)
    y = oracle.expert_outputs(b, d, ctx.rank, w)
    expected = reference.expected_combine(x, idx, wt, w)
    good = reference.check_combine(b.combine(y, d.handle), expected)
    good_again = reference.check_combine(b.combine(y, d.handle), expected)
    bare = reference.apply_experts(d.x_RH, d.tokens_per_expert, ctx.rank, w)          # no probs
    return good, good_again, reference.check_combine(b.combine(bare, d.handle), expected)


@needs_mcore
@pytest.mark.slow
def test_the_experts_apply_the_probs_and_combine_sums():
    w = Workload(num_tokens=64, hidden=256, num_experts=8, topk=4, ep=1)
    [(good, again, bare)] = run_ranks(_probs_matter, 1, "cpu", 120, args=(w,))
    assert good == "" and again == ""
    assert "relative error" in bare


# ---------------------------------------------------------------- GPU tier
@needs_mcore
@pytest.mark.gpu
@pytest.mark.slow
def test_dispatch_cli_mcore_beside_raw(tmp_path):
    out = tmp_path / "d.jsonl"
    rc = dispatch.main(["--ep", "1", "--num-tokens", "1024", "--hidden", "2048", "--num-experts", "32",
                        "--topk", "8", "--backend", "mcore-alltoall,alltoall", "--device", "cuda",
                        "--iters", "5", "--out", str(out)])
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 0
    assert {(r["backend"]["name"], r["check"]["status"]) for r in recs} == {("mcore-alltoall", "PASS"), ("alltoall", "PASS")}
    assert all(r["timing"]["median_us"] > 0 for r in recs)


@needs_mcore
def test_flex_sms_match_the_raw_backend_and_fusion_is_recorded():
    """Without --num-sms, mcore-hybridep gets HybridEP's own default (the raw hybridep's), not Megatron-Core's
    moe_hybridep_num_sms (16 on 0.16.1); a given --num-sms passes through; permute fusion is a knob."""
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    from moebench.backends.hybridep import default_num_sms
    from moebench.backends.mcore import matched_num_sms, mcore_version
    field = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    sms_field = "moe_flex_dispatcher_num_sms" if "moe_flex_dispatcher_num_sms" in field else "moe_hybridep_num_sms"
    if mcore_version().startswith("0.16."):
        assert field["moe_hybridep_num_sms"] == 16 and field["moe_permute_fusion"] is False   # the confound
    w = Workload(num_tokens=64, hidden=256, num_experts=16, topk=2, ep=8)
    b = McoreHybridEPBackend()
    kw = b._config_kwargs(TransformerConfig, w, 8)
    assert kw[sms_field] == matched_num_sms("hybridep", 8, 8) == default_num_sms(1) == 24
    assert b.num_sms_source.startswith("the raw backend") and kw["moe_permute_fusion"] is False
    assert matched_num_sms("hybridep", 16, 8) == default_num_sms(2) == 8        # two NVLink domains
    b = McoreHybridEPBackend(knob_values={"num_sms": 12, "moe_permute_fusion": 1})
    kw = b._config_kwargs(TransformerConfig, w, 8)
    assert kw[sms_field] == 12 and b.num_sms_source == "user" and kw["moe_permute_fusion"] is True
