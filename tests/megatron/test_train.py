"""`python -m moebench.megatron validate` and Megatron's FLOPs arithmetic.

CPU tier: the FLOPs against hand-computed cases, the verdict rules, the no-CUDA exit, and a tiny
megatron-core GPT-MoE run on CPU/gloo with torch.cuda emulated (functional only). GPU tier: the real
50-step run. The Megatron-LM cross-check runs where megatron.training imports (megatron-core >= 0.17,
Python >= 3.12: the H200 machine).
"""
import argparse
import importlib.util
import json
import math

import pytest
import torch

from moebench import megatron
from moebench.megatron.quick import loop
from moebench.records.megatron import ENGINE_LOOP, LOOP_SCHEMA
from moebench.megatron.quick import train as T

HAVE_MCORE = importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
needs_mcore = pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core is not installed")
TINY = ["--hidden", "64", "--heads", "4", "--ffn-hidden", "128", "--num-experts", "4", "--topk", "2",
        "--seq-length", "32", "--micro-batch", "2", "--vocab", "500", "--num-layers", "2"]


def test_flops_hand_computed_swiglu_moe():
    a = T.FlopsArgs(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=1024, padded_vocab_size=32768,
                    ffn_hidden_size=4096, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=4096, swiglu=True)
    B, s, h = 4, 1024, 1024
    mlp = 6 * h * (4096 * 2 * 3) * 2                 # 3 (fwd+wgrad+dgrad) x 2 (FMA) x h x moe_ffn x topk x 3 (SwiGLU) x L
    attn = 6 * (h * (1024 + 1024 + 1024) + 1024 * h) * 2
    logits = 6 * h * 32768
    core = B * s * s * 2 * 6 * 1024                  # causal /2 and (QK^T, PV) x2 cancel: 6q per layer
    assert mlp + attn + logits == 553_648_128
    assert T.num_floating_point_operations(a, B) == B * s * (mlp + attn + logits) + core == 2_319_282_339_840


def test_flops_hand_computed_gqa_dense_mix_shared():
    a = T.FlopsArgs(num_layers=4, hidden_size=512, num_attention_heads=8, seq_length=128, padded_vocab_size=1024,
                    ffn_hidden_size=1536, num_experts=16, moe_router_topk=4, moe_ffn_hidden_size=256, moe_layer_freq=2,
                    moe_shared_expert_intermediate_size=512, swiglu=False, kv_channels=64,
                    group_query_attention=True, num_query_groups=2)
    # layers [moe, dense, moe, dense]; per token: MLP 37,748,736 + attention 15,728,640 + logits 3,145,728
    assert T.num_floating_point_operations(a, 2) == 2 * 128 * 56_623_104 + 2 * 128 * 128 * 4 * 6 * 512 == 14_898_167_808


def test_tflops_per_gpu_is_megatron_throughput():
    spec = T.TrainSpec(micro_batch=3)
    f = T.num_floating_point_operations(T.flops_args(spec), 3 * 4)
    assert T.tflops_per_gpu(spec, 4, 0.25) == pytest.approx(f / (0.25e12 * 4))
    assert spec.padded_vocab == 32000 and T.TrainSpec(vocab=50257).padded_vocab == 50304


def test_flops_match_megatron_training():
    """Our copy against Megatron-LM's own function, where it imports."""
    try:
        from megatron.training.training import num_floating_point_operations as mlm_flops
    except Exception as e:  # noqa: BLE001 - needs megatron-core >= 0.17 on Python >= 3.12
        pytest.skip(f"megatron.training not importable here: {type(e).__name__}")
    spec = T.TrainSpec(num_layers=3, hidden=768, heads=12, ffn_hidden=1536, num_experts=16, topk=4, seq_length=512,
                       vocab=50257)
    a = T.flops_args(spec)
    ns = argparse.Namespace(**{**a.__dict__, "mtp_num_layers": None, "moe_latent_size": None,
                               "multi_latent_attention": False, "attention_output_gate": False,
                               "experimental_attention_variant": None, "hybrid_layer_pattern": None,
                               "hybrid_override_pattern": None, "is_hybrid_model": False})
    assert T.num_floating_point_operations(a, 8) == pytest.approx(mlm_flops(ns, 8), rel=1e-12)


# ---------------------------------------------------------------- verdict rules
def _rank(losses, steps=None, cls="MoEAlltoAllTokenDispatcher", mgr=None, calls=None, skipped=0):
    n = len(losses)
    return {"losses": losses, "step_s": [0.01] * n, "skipped_steps": skipped, "peak_mem_bytes": 2**30,
            "megatron_core": "x", "evidence": {"layers": [{"layer": 0, "dispatcher_class": cls, "comm_manager_class": mgr,
                                                           "token_dispatch_calls": n if calls is None else calls}]}}


def test_summarize_pass_and_failures():
    spec = T.TrainSpec(steps=20, micro_batch=1, seq_length=8, hidden=8, heads=1, ffn_hidden=8, vocab=128)
    falling = [5 - 0.1 * i for i in range(20)]
    ok = T.summarize([_rank(falling), _rank(falling)], spec, "alltoall", 2)
    assert ok["status"] == "PASS" and ok["loss"]["falling"] and ok["window"] == 10
    assert ok["loss"]["first_window"] == pytest.approx(sum(falling[:10]) / 10)
    flat = T.summarize([_rank([5.0] * 20)], spec, "alltoall", 1)
    assert flat["status"] == "FAIL" and "not falling" in flat["errors"][0]
    nan = T.summarize([_rank(falling[:19] + [float("nan")])], spec, "alltoall", 1)
    assert nan["status"] == "FAIL" and nan["nan_steps"] == 1
    wrong = T.summarize([_rank(falling)], spec, "deepep", 1)
    assert wrong["status"] == "FAIL" and "expected MoEFlexTokenDispatcher" in wrong["errors"][-1]
    mgr = T.summarize([_rank(falling, cls="MoEFlexTokenDispatcher", mgr="_DeepepManager")], spec, "hybridep", 1)
    assert "expected _HybridEPManager" in mgr["errors"][-1]
    idle = T.summarize([_rank(falling, calls=3)], spec, "alltoall", 1)
    assert "ran 3x in 20 steps" in idle["errors"][-1]
    skip = T.summarize([_rank(falling), _rank(falling, skipped=2)], spec, "alltoall", 2)
    assert skip["skipped_steps"] == 2 and skip["status"] == "FAIL"


def test_slowest_rank_sets_step_time():
    spec = T.TrainSpec(steps=4, window=2)
    r0, r1 = _rank([4.0, 3.0, 2.0, 1.0]), _rank([4.0, 3.0, 2.0, 1.0])
    r1["step_s"] = [0.01, 0.01, 0.03, 0.05]
    s = T.summarize([r0, r1], spec, "alltoall", 2)
    assert s["step_ms"]["steady_mean"] == pytest.approx(40.0)
    assert s["tflops_per_gpu"] == pytest.approx(T.tflops_per_gpu(spec, 2, 0.04))


def test_candidate_must_match_control_first_loss():
    ctl = {"role": "control", "loss": {"first": 10.0}, "step_ms": {"steady_mean": 10.0}, "errors": [], "status": "PASS"}
    same = {"role": "candidate", "loss": {"first": 10.05}, "step_ms": {"steady_mean": 8.0}, "errors": [], "status": "PASS"}
    off = {"role": "candidate", "loss": {"first": 11.0}, "step_ms": {"steady_mean": 8.0}, "errors": [], "status": "PASS"}
    loop.compare_to_control([ctl, same, off])
    assert same["status"] == "PASS" and same["vs_control"]["step_time_ratio"] == pytest.approx(0.8)
    assert off["status"] == "FAIL" and "differs from the control" in off["errors"][0]


# ---------------------------------------------------------------- CLI
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_validate_without_cuda_exits_2(capsys):
    assert megatron.main(["validate", "--dispatcher", "alltoall", "--steps", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moebench.megatron validate: error:")
    assert ("needs CUDA" in err[0]) if HAVE_MCORE else ("megatron-core" in err[0])


@pytest.mark.parametrize("argv", [["--steps", "1"], ["--hidden", "100", "--heads", "16"], ["--topk", "9"]])
def test_validate_bad_input_exits_2(argv, capsys):
    assert megatron.main(["validate", "--dispatcher", "alltoall", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@needs_mcore
@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.slow
def test_validate_cpu_functional_run(ep, tmp_path, capsys):
    out = tmp_path / "v.jsonl"
    rc = megatron.main(["validate", "--dispatcher", "alltoall", "--steps", "12", "--ep", str(ep), "--device", "cpu",
                        "--out", str(out), *TINY])
    text = capsys.readouterr().out
    [r] = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 0 and r["status"] == "PASS", r.get("errors")
    assert "not a measurement" in text and "MoEAlltoAllTokenDispatcher x12" in text
    assert "CPU functional run (not a validation" in text and r["functional"] is True
    assert r["schema"] == LOOP_SCHEMA and r["engine"] == ENGINE_LOOP and r["world"] == ep and r["window"] == 6
    assert [lay["token_dispatch_calls"] for lay in r["evidence"]["layers"]] == [12, 12]
    assert r["evidence"]["param_dtypes"] == ["torch.bfloat16"]     # CUDA's layer_norm refuses fp32 norm weights
    assert len(r["losses"]) == 12 and all(math.isfinite(x) for x in r["losses"])
    assert r["loss"]["last_window"] < r["loss"]["first_window"]
    spec = T.TrainSpec(steps=12, hidden=64, heads=4, ffn_hidden=128, num_experts=4, topk=2, seq_length=32,
                       micro_batch=2, vocab=500, num_layers=2)
    assert r["flops_per_step"] == T.num_floating_point_operations(T.flops_args(spec), 2 * ep)
    assert r["tflops_per_gpu"] == pytest.approx(T.tflops_per_gpu(spec, ep, r["step_ms"]["steady_mean"] / 1e3))


# ---------------------------------------------------------------- GPU tier
@needs_mcore
@pytest.mark.gpu
@pytest.mark.slow
def test_validate_alltoall_50_steps_gpu(tmp_path):
    out = tmp_path / "v.jsonl"
    rc = megatron.main(["validate", "--dispatcher", "alltoall", "--steps", "50", "--ep", "1", "--out", str(out)])
    [r] = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 0 and r["status"] == "PASS", r.get("errors")
    assert r["loss"]["falling"] and r["nan_steps"] == 0 and r["tflops_per_gpu"] > 0
    assert r["peak_mem_bytes"][0] > 0


def test_validate_ranks_per_gpu_needs_gpus(capsys):
    """Shared-GPU training (--ranks-per-gpu N) is refused with one line where no GPU can be shared."""
    assert megatron.main(["validate", "--dispatcher", "hybridep", "--device", "cpu", "--ranks-per-gpu", "2"]) == 2
    assert "--device cpu was asked for" in capsys.readouterr().err
    assert megatron.main(["validate", "--dispatcher", "alltoall", "--ranks-per-gpu", "0"]) == 2
    assert "--ranks-per-gpu must be >= 1" in capsys.readouterr().err


def test_flex_setup_fails_a_deepep_build_megatron_cannot_size(monkeypatch):
    """Megatron's flex/deepep path on a DeepEP without NVSHMEM: the training rank fails at once with the reason."""
    from moebench.env import deepep
    from moebench.megatron.quick import train
    monkeypatch.setattr(deepep, "rdma_size_problem", lambda *a: "this DeepEP was built without NVSHMEM ...")
    with pytest.raises(RuntimeError, match="without NVSHMEM"):
        train.flex_setup("deepep", 2, 1024, ranks_per_gpu=2)
    assert train.flex_setup("alltoall", 2, 1024, ranks_per_gpu=2) == []


def test_the_quick_loop_takes_the_window_it_is_given():
    """--window reached the Megatron-LM path only; the quick loop always picked its own."""
    from argparse import Namespace

    from moebench.megatron.quick.loop import MODEL_OPTIONS, spec_of
    base = dict.fromkeys(MODEL_OPTIONS) | {"iters": 10, "seed": 1, "num_sms": None}
    assert spec_of(Namespace(**base, window=3)).steady_window == 3
    assert spec_of(Namespace(**base, window=None)).steady_window == 5          # its own: half of 10 steps
