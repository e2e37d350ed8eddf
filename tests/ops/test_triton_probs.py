"""Triton permute with fused routing probabilities (probs_TK -> probs_R, as Transformer Engine's
moe_permute_with_probs), called directly (triton_impl.permute) under TRITON_INTERPRET=1 and
compared with the torch oracle: rows, scales, row_map, tokens per expert, and
probs_R[row_map[t, k]] = probs_TK[t, k] with 0 on padding rows. Outputs are allocated poisoned
(torch.empty filled with a sentinel), so a row or prob the kernels fail to write shows."""
from __future__ import annotations

import os

import pytest
import torch
from conftest import LaunchSpy, run_interpreted

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_interpreter")
SENTINEL = 85
COPIES = {"plain": "1024:4:1024:4:0:0", "streaming": "1024:4:1024:4:0:1", "tma": "1024:4:1024:4:1",
          "rows": "1024:4:1024:4:0:1:256:4:16:128:4:1:4", "rows-plain-bh8": "8:4:1024:4:0:0:256:4:16:128:4:1:8"}


def routing(T, K, E, seed, mask_frac=0.25):
    g = torch.Generator().manual_seed(seed)
    idx = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K] if K <= E else torch.randint(0, E, (T, K), generator=g)
    idx[torch.rand(T, K, generator=g) < mask_frac] = -1
    idx[T // 2] = -1                                            # a token with no destination
    return idx, torch.rand(T, K, generator=g)


def inputs(T, H, payload, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    if payload == "bf16":
        return x.bfloat16(), None
    return x.to(torch.float8_e4m3fn), torch.rand(T, 3, generator=g)   # fp8 rows move as bytes


def oracle(x, idx, E, scales, pad, probs):
    """torch_impl's rows; probs_R = zeros(R); probs_R[row_map[valid]] = probs_TK[valid]."""
    from moebench.ops import torch_impl
    out, out_s, row_map, tpe = torch_impl.permute(x, idx, E, scales, pad)[:4]
    probs_R = torch.zeros(out.shape[0], dtype=torch.float32)
    valid = row_map >= 0
    probs_R[row_map[valid].long()] = probs[valid].float()
    return out, out_s, row_map, tpe, probs_R


def assert_same(got, want):
    out, out_s, row_map, tpe, probs_R = got
    w_out, w_s, w_map, w_tpe, w_p = want
    assert torch.equal(row_map, w_map) and torch.equal(tpe, w_tpe)
    assert out.shape == w_out.shape and torch.equal(out.view(torch.uint8), w_out.view(torch.uint8))
    assert (out_s is None) == (w_s is None)
    if out_s is not None:
        assert torch.equal(out_s, w_s)
    assert probs_R.dtype == torch.float32 and torch.equal(probs_R, w_p)


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty returns tensors filled with SENTINEL, so unwritten outputs are not zeros by luck."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(SENTINEL))


@pytest.fixture
def ti():
    from moebench.ops import triton_impl
    return triton_impl


@interpreted
@pytest.mark.parametrize("copy", list(COPIES))
@pytest.mark.parametrize("pad", [0, 16])
@pytest.mark.parametrize("payload,H", [("bf16", 40), ("fp8", 64)])
def test_permute_probs_match_oracle(ti, poisoned, monkeypatch, payload, H, pad, copy):
    T, K, E = 37, 4, 6
    tma = LaunchSpy(ti._permute_copy_tma)
    monkeypatch.setattr(ti, "_permute_copy_tma", tma)
    x, scales = inputs(T, H, payload, seed=H + pad)
    idx, probs = routing(T, K, E, seed=H + pad)
    want = oracle(x, idx, E, scales, pad, probs)
    assert bool((want[4] == 0).any()) == (pad > 0)                  # padding rows exist
    for n_out in (-1, want[0].shape[0]):
        assert_same(ti.permute(x, idx, E, scales, pad, n_out, COPIES[copy], probs), want)
    assert tma.launches == (2 if copy == "tma" else 0)


@interpreted
@pytest.mark.parametrize("H", [5, 6])
def test_probs_with_byte_and_halfword_rows(ti, poisoned, H):
    """fp8 rows of 5 / 6 bytes (uint8 / int16 words), bf16 probs (probs_R is their fp32 value),
    three scan programs (E 130), K 1, padding."""
    T, K, E, pad = 50, 1, 130, 16
    x, scales = inputs(T, H, "fp8", seed=H)
    idx, probs = routing(T, K, E, seed=H)
    probs = probs.bfloat16()
    assert_same(ti.permute(x, idx, E, scales, pad, -1, "", probs), oracle(x, idx, E, scales, pad, probs))


@interpreted
@pytest.mark.parametrize("pad", [0, 16])
def test_probs_add_no_launch(ti, monkeypatch, pad):
    """probs ride in the copy kernel: index kernels + copy (+ _zero_pad when padding) with or
    without them; without probs the 5th result is None."""
    launches = []
    launch = ti.launch
    monkeypatch.setattr(ti, "launch", lambda fn, *a, **kw: (launches.append(fn.__name__), launch(fn, *a, **kw)))
    x, _ = inputs(9, 8, "bf16", seed=1)
    idx, probs = routing(9, 2, 3, seed=1)
    res = ti.permute(x, idx, 3, None, pad, -1, "", None)
    assert len(res) == 5 and res[1] is None and res[4] is None
    without, launches[:] = list(launches), []
    res = ti.permute(x, idx, 3, None, pad, -1, "", probs)
    assert_same(res, oracle(x, idx, 3, None, pad, probs))
    assert launches == without == ["_route_rank", "_route_scan", "_permute_copy"] + ["_zero_pad"] * (pad > 1)


@interpreted
def test_no_slots(ti):
    x, probs = torch.zeros(0, 8, dtype=torch.bfloat16), torch.zeros(0, 2)
    out, out_s, row_map, tpe, probs_R = ti.permute(x, torch.zeros(0, 2, dtype=torch.long), 4, None, 0, -1, "", probs)
    assert out.shape == (0, 8) and out_s is None and row_map.shape == (0, 2) and tpe.tolist() == [0] * 4
    assert probs_R.shape == (0,) and probs_R.dtype == torch.float32


@interpreted
@pytest.mark.parametrize("kernel", ["_permute_copy", "_permute_copy_tma", "_permute_copy_rows"])
@pytest.mark.parametrize("H", [1536, 1000])
def test_copy_kernels_write_only_their_rows(ti, kernel, H):
    """Kernel level: into outputs prefilled with a sentinel, each copy kernel writes every valid
    slot's row, scales and prob and nothing else (no clipped TMA box spills into the next row;
    padding rows and rows past the count keep the sentinel); then _zero_pad zeroes exactly the
    padding rows."""
    T, K, E, pad = 10, 3, 7, 4
    x, _ = inputs(T, H, "bf16", seed=H)
    scales = torch.rand(T, 2)
    idx, probs = routing(T, K, E, seed=H, mask_frac=0.3)
    idx = idx.contiguous()                                      # the kernels take it so
    ws, tpe, lay = ti.route(idx, E, pad)
    r_max = T * K + E * (pad - 1)
    out = torch.full((r_max, H), -7, dtype=torch.int16).view(torch.bfloat16)
    out_s = torch.full((r_max, 2), -7.0)
    out_p = torch.full((r_max,), -7.0)
    row_map = torch.empty((T, K), dtype=torch.int32)
    xw, ow = ti._words(x), ti._words(out)
    W = xw.shape[1]
    if kernel == "_permute_copy":
        ti._permute_copy[(T,)](xw, scales, probs, ow, out_s, out_p, idx, ws, row_map, lay.B0, lay.S0, W, 2,
                               E, lay.SB, K, 4, 1024, True, True, 16, 1, False)
    elif kernel == "_permute_copy_rows":      # 4 tokens per program: the last program has 2 past T
        ti._permute_copy_rows[(3,)](xw, scales, probs, ow, out_s, out_p, idx, ws, row_map, lay.B0, lay.S0, T, W,
                                    2, E, lay.SB, K, 4, 4, 256, True, True, 16, 1, False)
    else:
        desc, NC, BW, NB, BB = ti._tma_desc(ow, r_max, W, 1024)
        ti._permute_copy_tma[(T,)](xw, scales, probs, desc, out_s, out_p, idx, ws, row_map, lay.B0, lay.S0,
                                   W, 2, E, lay.SB, NC, BW, K=K, KP=4, NB=NB, BB=BB, HAS_S=True,
                                   HAS_P=True, BS=16, PDL=False)
    want = oracle(x, idx, E, scales, pad, probs)
    assert torch.equal(row_map, want[2])
    valid = row_map >= 0
    rows = row_map[valid].long()
    tok = torch.arange(T)[:, None].expand(T, K)[valid]
    assert torch.equal(out.view(torch.int16)[rows], x.view(torch.int16)[tok])
    assert torch.equal(out_s[rows], scales[tok]) and torch.equal(out_p[rows], probs[valid])
    untouched = torch.ones(r_max, dtype=torch.bool)
    untouched[rows] = False
    R = want[0].shape[0]
    assert untouched[:R].sum() > 0 and untouched[R:].sum() > 0    # padding rows and the tail exist
    for t in (out.view(torch.int16), out_s, out_p):
        assert bool((t[untouched] == -7).all())
    ti._zero_pad[(E,)](ow, out_s, out_p, ws, lay.S0, tpe, W, 2, E, 1024, True, True, 16)
    pad_rows = untouched.clone()
    pad_rows[R:] = False
    for t in (out.view(torch.int16), out_s, out_p):
        assert bool((t[pad_rows] == 0).all()) and bool((t[R:] == -7).all())
    assert torch.equal(out_p[:R], want[4])


@pytest.mark.skipif(INTERPRET or torch.cuda.is_available(), reason="runs the cases directly")
@pytest.mark.slow
def test_interpreter():
    """Triton's interpreter is chosen when triton.jit runs, so run the cases in a fresh process."""
    pytest.importorskip("triton")
    bad = run_interpreted(__file__, ("permute_probs_match_oracle", "not permute_probs_match_oracle"))
    assert not bad, bad
