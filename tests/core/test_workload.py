"""Workload validation and the statistics of every routing mode."""
import re

import numpy as np
import pytest
import torch

from moebench.core.workload import Routing, Workload, WorkloadError, load_trace, make_routing, make_tokens


def small(**kw):
    base = dict(num_tokens=512, hidden=256, num_experts=32, topk=4, ep=4)
    return Workload(**{**base, **kw})


@pytest.mark.parametrize("kw, msg", [
    (dict(num_experts=30, ep=4), "not divisible"),
    (dict(topk=0), "--topk"),
    (dict(topk=33), "--topk"),
    (dict(num_tokens=0), "--num-tokens"),
    (dict(hidden=0), "--hidden"),
    (dict(dtype="fp16"), "--dtype"),
    (dict(dtype="fp8", hidden=200), "fp8 needs"),
    (dict(routing="pareto"), "unknown routing"),
    (dict(routing="zipf:x"), "bad number"),
    (dict(routing="uniform,dropped:0.1"), "unknown routing modifier"),
    (dict(routing="uniform,masked:1.5"), "masked"),
    (dict(routing="group:5:2"), "group"),
    (dict(routing="group:8:1", topk=8), "fewer than topk"),
    (dict(routing="trace:/nonexistent.pt"), "found no such file"),
])
def test_bad_workloads_raise(kw, msg):
    with pytest.raises(WorkloadError, match=msg):
        small(**kw)


def test_routing_spec_roundtrip():
    for spec in ["uniform", "balanced", "zipf:1.2", "group:8:4", "uniform,masked:0.25"]:
        assert str(Routing.parse(spec)) == spec


def test_deterministic_per_seed_and_rank():
    w = small()
    a, b = make_routing(w, 1), make_routing(w, 1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(make_routing(w, 2)[0], a[0])
    assert not torch.equal(make_routing(w.replace(seed=1), 1)[0], a[0])
    assert torch.equal(make_tokens(w, 3), make_tokens(w, 3))
    assert make_tokens(w, 3).dtype == torch.bfloat16


@pytest.mark.parametrize("spec", ["uniform", "balanced", "zipf:1.0", "group:8:2"])
def test_distinct_experts_and_softmax_weights(spec):
    w = small(routing=spec)
    idx, wt = make_routing(w, 0)
    assert idx.shape == (512, 4) and idx.dtype == torch.int64
    assert (idx >= 0).all() and (idx < 32).all()
    assert all(len(set(row.tolist())) == 4 for row in idx), "experts repeat within a token"
    torch.testing.assert_close(wt.sum(1), torch.ones(512))
    assert wt.dtype == torch.float32 and (wt > 0).all()


def test_balanced_gives_every_expert_the_same_load():
    w = small(routing="balanced")
    for rank in range(4):
        counts = torch.bincount(make_routing(w, rank)[0].flatten(), minlength=32)
        assert (counts == 512 * 4 // 32).all()


def test_uniform_is_roughly_flat_and_zipf_is_skewed():
    uni = torch.bincount(make_routing(small(num_tokens=4096), 0)[0].flatten(), minlength=32).float()
    zipf = torch.bincount(make_routing(small(num_tokens=4096, routing="zipf:1.5"), 0)[0].flatten(),
                          minlength=32).float()
    assert uni.max() / uni.mean() < 1.2
    assert zipf.max() / zipf.mean() > 3


def test_group_limited_uses_only_top_groups():
    w = small(routing="group:8:2")
    idx, _ = make_routing(w, 0)
    groups = idx // 4
    assert max(len(set(g.tolist())) for g in groups) <= 2


def test_masked_fraction_and_zero_weights():
    w = small(num_tokens=4096, routing="uniform,masked:0.25")
    idx, wt = make_routing(w, 0)
    frac = (idx == -1).float().mean().item()
    assert 0.22 < frac < 0.28
    assert (wt[idx == -1] == 0).all()
    alive = (idx >= 0).any(1)
    torch.testing.assert_close(wt[alive].sum(1), torch.ones(int(alive.sum())))


def test_trace_replay_pt_and_npz(tmp_path):
    trace = torch.rand(100, 32).argsort(dim=1)[:, :4]
    torch.save({"topk_idx": trace}, tmp_path / "t.pt")
    np.savez(tmp_path / "t.npz", topk_idx=trace.numpy())
    for f in ("t.pt", "t.npz"):
        w = small(num_tokens=64, routing=f"trace:{tmp_path / f}")
        idx0, _ = make_routing(w, 0)
        idx1, _ = make_routing(w, 1)
        assert torch.equal(idx0, trace[:64])
        assert torch.equal(idx1, trace[torch.arange(64, 128) % 100])


def test_trace_with_wrong_topk_or_ids_is_rejected(tmp_path):
    torch.save(torch.randint(0, 32, (10, 3)), tmp_path / "k3.pt")
    torch.save(torch.full((10, 4), 40), tmp_path / "big.pt")
    with pytest.raises(WorkloadError, match="shape"):
        load_trace(str(tmp_path / "k3.pt"), 4, 32)
    with pytest.raises(WorkloadError, match="expert ids"):
        load_trace(str(tmp_path / "big.pt"), 4, 32)
    torch.save(torch.tensor([[1, 2, 3, 1]]), tmp_path / "dup.pt")
    with pytest.raises(WorkloadError, match="twice"):
        load_trace(str(tmp_path / "dup.pt"), 4, 32)


ODD_TENSORS = {   # a trace of these kinds loads, and then crashed the reading of its ids (issue 50)
    "sparse-coo": (lambda t: t.to_sparse(), "a sparse tensor (sparse_coo; save t.to_dense())"),
    "sparse-csr": (lambda t: t.to_sparse_csr(), "a sparse tensor (sparse_csr; save t.to_dense())"),
    "in-a-dict": (lambda t: {"topk_idx": t.to_sparse()}, "a sparse tensor (sparse_coo"),
    "nested": (lambda t: torch.nested.nested_tensor([t[:3], t[:5]]), "a nested tensor"),
    "quantized": (lambda t: torch.quantize_per_tensor(t.float(), 1.0, 0, torch.qint8), "a quantized tensor"),
    "meta": (lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"), "a meta tensor, which holds no values"),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind", ODD_TENSORS)
def test_a_trace_of_an_odd_tensor_kind_says_which(tmp_path, kind):
    make, what = ODD_TENSORS[kind]
    torch.save(make(torch.rand(10, 32).argsort(dim=1)[:, :4]), tmp_path / "t.pt")
    with pytest.raises(WorkloadError, match="found " + re.escape(what)):
        load_trace(str(tmp_path / "t.pt"), 4, 32)


@pytest.mark.parametrize("name", ["t.pt", "t.npz"])
def test_a_trace_the_user_cannot_read_says_so(tmp_path, monkeypatch, name):
    """As root every file is readable: the refusal is simulated where the loaders open the file."""
    trace = torch.rand(10, 32).argsort(dim=1)[:, :4]
    torch.save(trace, tmp_path / "t.pt")
    np.savez(tmp_path / "t.npz", topk_idx=trace.numpy())
    real_open = open

    def denied(path, *a, **k):
        if str(path).endswith(name):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)
    monkeypatch.setattr("builtins.open", denied)
    monkeypatch.setattr("io.open", denied)
    with pytest.raises(WorkloadError, match=re.escape("found a file it cannot read (Permission denied)")):
        load_trace(str(tmp_path / name), 4, 32)


def test_bytes_per_token():
    assert small(hidden=7168).bytes_per_token == 2 * 7168
    assert small(hidden=7168, dtype="fp8").bytes_per_token == 7168 + 4 * 56


def test_fp8_inputs_are_made_on_the_host_whatever_the_device(monkeypatch):
    """The oracle quantizes on the host (core/reference.py), so every device must hold the host's fp8 bytes: CUDA
    divides by a scalar through its reciprocal, and a scale quantized there differs from the host's in the last
    bit (here: the reciprocal's rounding changes most scales, and some payload bytes with them). 'meta' stands in
    for a device: the quantizer must see host tensors, and the caller gets the device's."""
    from moebench.core import workload as wl
    x = torch.randn(64, 7 * 128).to(torch.bfloat16).float().view(64, 7, 128)
    amax = x.abs().amax(2).clamp(min=1e-4)
    assert (amax / 448.0 != amax * (1.0 / 448.0)).any()       # the two roundings do differ on such data
    seen, real = [], wl.fp8_quantize
    monkeypatch.setattr(wl, "fp8_quantize", lambda t: (seen.append(t.device.type), real(t))[1])
    x, idx, wt, q, s = wl.rank_inputs(small(dtype="fp8"), 1, "meta")
    assert seen == ["cpu"]
    assert {t.device.type for t in (x, idx, wt, q, s)} == {"meta"}
