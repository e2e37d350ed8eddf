"""CPU tier of moebench.ops: the torch reference (oracle), Triton under TRITON_INTERPRET=1,
megatron-core's unfused permute/unpermute as a second oracle, and hypothesis properties."""
from __future__ import annotations

import os

import pytest
import torch
from conftest import LaunchSpy, run_interpreted
from hypothesis import given, settings
from hypothesis import strategies as st

import moebench.ops as ops

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def make_routing(T, K, E, mask_frac=0.2, seed=0, dtype=torch.int64, distinct=True):
    """topk_idx [T, K]: distinct experts per token (like a router), some slots masked to -1."""
    g = torch.Generator().manual_seed(seed)
    if distinct and K <= E:
        idx = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K]
    else:
        idx = torch.randint(0, E, (T, K), generator=g)
    idx[torch.rand(T, K, generator=g) < mask_frac] = -1
    return idx.to(dtype)


def payload(T, H, dtype=torch.bfloat16, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    return x.to(dtype)


def assert_same_permute(a: ops.Permuted, b: ops.Permuted):
    assert torch.equal(a.row_map_TK, b.row_map_TK)
    assert torch.equal(a.tokens_per_expert.cpu(), b.tokens_per_expert.cpu())
    assert a.x_RH.shape == b.x_RH.shape
    assert torch.equal(a.x_RH.view(torch.uint8), b.x_RH.view(torch.uint8))
    assert (a.scales_RS is None) == (b.scales_RS is None)
    if a.scales_RS is not None:
        assert torch.equal(a.scales_RS, b.scales_RS)
    assert (a.probs_R is None) == (b.probs_R is None)
    if a.probs_R is not None:
        assert a.probs_R.dtype == torch.float32 and torch.equal(a.probs_R, b.probs_R)


# ---------------------------------------------------------------- reference semantics
def test_reference_order_by_hand():
    x = torch.arange(5, dtype=torch.float32)[:, None].repeat(1, 3).bfloat16()
    idx = torch.tensor([[0, 2], [1, -1], [2, 0], [-1, -1], [1, 2]])
    p = ops.permute(x, idx, 3, impl="torch")
    # expert 0: tokens 0, 2; expert 1: tokens 1, 4; expert 2: tokens 0, 2, 4
    assert p.x_RH[:, 0].tolist() == [0, 2, 1, 4, 0, 2, 4]
    assert p.tokens_per_expert.tolist() == [2, 2, 3]
    assert p.row_map_TK.tolist() == [[0, 4], [2, -1], [5, 1], [-1, -1], [3, 6]]
    assert p.row_map_TK.dtype == torch.int32 and p.scales_RS is None


def test_reference_padding_and_unpermute():
    x = payload(5, 4)
    idx = torch.tensor([[0, 2], [1, -1], [2, 0], [-1, -1], [1, 2]], dtype=torch.int32)
    p = ops.permute(x, idx, 3, pad_multiple=4, impl="torch")
    assert p.tokens_per_expert.tolist() == [4, 4, 4] and p.x_RH.shape[0] == 12
    assert p.row_map_TK.tolist() == [[0, 8], [4, -1], [9, 1], [-1, -1], [5, 10]]
    for pad_row in (2, 3, 6, 7, 11):
        assert not p.x_RH[pad_row].any()
    w = torch.rand(5, 2)
    out = ops.unpermute(p.x_RH, p.row_map_TK, w, impl="torch")
    want = (w[:, :1] * x.float() + torch.where(idx[:, 1:] >= 0, w[:, 1:], 0) * x.float()).bfloat16()
    want[3] = 0
    torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)


def test_reference_probs_follow_rows():
    """probs_TK[t, k] lands on row row_map[t, k]; padding rows and masked slots carry nothing."""
    x = payload(5, 4)
    idx = torch.tensor([[0, 2], [1, -1], [2, 0], [-1, -1], [1, 2]])
    w = torch.arange(1, 11, dtype=torch.float32).view(5, 2)
    p = ops.permute(x, idx, 3, pad_multiple=4, impl="torch", probs_TK=w.bfloat16())
    assert p.probs_R.dtype == torch.float32
    assert p.probs_R.tolist() == [1, 6, 0, 0, 3, 9, 0, 0, 2, 5, 10, 0]
    assert ops.permute(x, idx, 3, impl="torch").probs_R is None
    counted = ops.permute(x, idx, 3, pad_multiple=4, impl="torch", counts_to_host=True)
    assert counted.tokens_per_expert_host == [4, 4, 4] and p.tokens_per_expert_host is None
    with pytest.raises(ValueError, match="must match"):
        ops.permute(x, idx, 3, impl="torch", probs_TK=w[:, :1])


def test_sort_chunks_reference():
    x = torch.arange(6.0)[:, None]
    out = ops.sort_chunks_by_idxs(x, [1, 2, 3], [2, 0, 1], impl="torch")
    assert out[:, 0].tolist() == [3, 4, 5, 0, 1, 2]
    assert ops.sort_chunks_by_idxs(x, torch.tensor([0, 6, 0]), torch.tensor([2, 1, 0]),
                                   impl="torch").equal(x)


def test_best_impl_and_status_on_cpu():
    assert ops.best_impl("cpu") == "torch"
    assert all(ops.best_impl("cpu", op) == "torch" for op in ops.PREFERENCE)
    status = ops.impl_status()
    assert set(status) == {"torch", "triton", "cuda"} and status["torch"][0]
    if not torch.cuda.is_available():
        assert status["cuda"] == (False, "no CUDA device")
    with pytest.raises(ValueError, match="unknown impl"):
        ops.permute(payload(2, 4), torch.zeros(2, 1, dtype=torch.long), 2, impl="nope")


def test_opcheck_torch_impl():
    x = payload(6, 8)
    idx = make_routing(6, 2, 4, seed=3)
    torch.library.opcheck(torch.ops.moebench.permute.default, (x, idx, 4, None, 0, -1, "torch"))
    torch.library.opcheck(torch.ops.moebench.permute.default,
                          (x, idx, 4, None, 0, -1, "torch", torch.rand(6, 2)))
    p = ops.permute(x, idx, 4, impl="torch")
    torch.library.opcheck(torch.ops.moebench.unpermute.default,
                          (p.x_RH, p.row_map_TK, torch.rand(6, 2), "torch"))
    torch.library.opcheck(torch.ops.moebench.sort_chunks_by_idxs.default,
                          (x, torch.tensor([2, 0, 4]), torch.tensor([2, 1, 0]), "torch"))


# ---------------------------------------------------------------- Triton under the interpreter
TRITON_CASES = [  # T, H, K, E, pad, fp8, idx dtype
    (1, 3, 1, 2, 0, False, torch.int64),
    (37, 24, 4, 6, 0, False, torch.int32),
    (37, 20, 4, 6, 4, True, torch.int64),
    (64, 40, 8, 16, 8, False, torch.int64),
    (40, 16, 8, 300, 0, False, torch.int64),    # more slots than one rank block (320 > 256); E > 256
    (70, 8, 4, 40, 8, True, torch.int32),       # two rank blocks, three scan programs, padded
]


def _triton_case(T, H, K, E, pad, fp8, idt):
    x = payload(T, H)
    scales = None
    if fp8:
        x = x.float().to(torch.float8_e4m3fn)
        scales = torch.rand(T, 3)
    idx = make_routing(T, K, E, seed=T + E, dtype=idt)
    a = ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl="triton")
    b = ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl="torch")
    assert_same_permute(a, b)
    probs = torch.rand(T, K)
    assert_same_permute(ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl="triton", probs_TK=probs),
                        ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl="torch", probs_TK=probs))
    y = payload(b.x_RH.shape[0], H, seed=5)
    w = torch.rand(T, K)
    torch.testing.assert_close(ops.unpermute(y, b.row_map_TK, w, impl="triton"),
                               ops.unpermute(y, b.row_map_TK, w, impl="torch"), rtol=1e-2, atol=1e-2)
    sizes = torch.randint(0, 5, (6,))
    xr = payload(int(sizes.sum()), H, seed=7)
    perm = torch.randperm(6)
    assert torch.equal(ops.sort_chunks_by_idxs(xr, sizes, perm, impl="triton"),
                       ops.sort_chunks_by_idxs(xr, sizes, perm, impl="torch"))


@pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_triton_interpreter")
@pytest.mark.parametrize("tma,cs", [(1, 0), (0, 0), (0, 1)], ids=["tma", "plain", "streaming"])
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_triton_matches_reference(case, tma, cs, monkeypatch):
    from moebench.ops import triton_impl
    monkeypatch.setattr(triton_impl, "DEFAULT_KNOBS",
                        triton_impl.DEFAULT_KNOBS._replace(copy_tma=tma, copy_cs=cs))
    ops._status.clear()
    _triton_case(*case)


@pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_triton_interpreter")
@pytest.mark.parametrize("route", [(8, 2, 4, 16, 2), (512, 8, 16, 128, 4), (256, 1, 32, 4, 8)],
                         ids=lambda r: "sb{}-rw{}-eb{}-bb{}-sw{}".format(*r))
def test_triton_route_knobs(route, monkeypatch):
    """Other rank block / scan chunk sizes (the knobs the H200 sweep tries) give the same permute:
    (8, .., 4, 16): 65 rank blocks of 16 slots, the scan looping 5 times over block chunks, 3 scan
    programs of 4 experts (10 over 40 experts in the second case); (512, ..): 3 blocks of 512 slots;
    (256, .., 32, 4): 5 blocks, the scan looping twice over chunks of 4."""
    from moebench.ops import triton_impl
    monkeypatch.setattr(triton_impl, "DEFAULT_KNOBS",
                        triton_impl.DEFAULT_KNOBS._replace(**dict(zip(
                            ("rank_sb", "rank_warps", "scan_eb", "scan_bb", "scan_warps"), route))))
    ops._status.clear()
    _triton_case(130, 16, 8, 10, 4, False, torch.int64)
    _triton_case(70, 8, 4, 40, 8, True, torch.int32)


def _spy_copies(monkeypatch):
    from moebench.ops import triton_impl
    spies = {name: LaunchSpy(getattr(triton_impl, name)) for name in ("_permute_copy", "_permute_copy_tma")}
    for name, spy in spies.items():
        monkeypatch.setattr(triton_impl, name, spy)
    return triton_impl, spies


TMA_CASES = [  # T, H, K, E, pad, fp8, COPY_BH; bf16 row = H / 2 words, fp8 row = H / 4 words
    (9, 1536, 4, 6, 0, False, 1024),    # W 768 as [R, 3, 256], box [1, 4, 256] clipped at 3
    (7, 512, 1, 3, 0, False, 1024),     # K 1; W 256: one box per row
    (5, 1024, 2, 64, 8, False, 256),    # most experts get no tokens; padding; 1 KB boxes
    (11, 1024, 8, 16, 4, True, 512),    # fp8 (W 256) with scales, padding
    (6, 1000, 3, 4, 2, False, 1024),    # W 500 as [R, 1, 500], boxes of 256 clipped at 500
    (4, 24, 2, 3, 0, False, 1024),      # W 12, box of 16 words clipped at 12
    (8, 4096, 8, 8, 0, False, 4096),    # W 2048, box [1, 8, 256] (128-byte swizzle on the GPU)
]


@pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_triton_interpreter")
@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-bh{c[6]}")
def test_triton_tma_matches_reference(case, monkeypatch):
    """The TMA copy (the interpreter emulates tensor descriptors) against the torch reference,
    bitwise, with masked slots, a fully masked token, and the plain copy kernel as a cross-check."""
    T, H, K, E, pad, fp8, bh = case
    ti, spies = _spy_copies(monkeypatch)
    ops._status.clear()
    x = payload(T, H)
    scales = None
    if fp8:
        x = x.float().to(torch.float8_e4m3fn)
        scales = torch.rand(T, H // 128 + 1)
    idx = make_routing(T, K, E, mask_frac=0.3, seed=T * H + K)
    idx[T // 2] = -1                                             # a token with no destination
    want = ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl="torch")
    for tma in (1, 0):
        impl = f"triton@{bh}:4:1024:4:{tma}"
        got = ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl=impl)
        assert_same_permute(got, want)
        got_n = ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl=impl,
                            num_out_rows=want.x_RH.shape[0])
        assert_same_permute(got_n, want)
    assert spies["_permute_copy_tma"].launches == 2 and spies["_permute_copy"].launches == 2


@pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_triton_interpreter")
def test_triton_tma_fallback_selection(monkeypatch):
    """Rows that are not a multiple of 16 bytes, and copy_tma 0, take the plain copy kernel."""
    ti, spies = _spy_copies(monkeypatch)
    ops._status.clear()
    idx = make_routing(6, 2, 3, seed=1)
    for H, tma, used in ((20, 1, "_permute_copy"), (6, 1, "_permute_copy"), (256, 0, "_permute_copy"),
                         (256, 1, "_permute_copy_tma")):
        before = spies[used].launches
        x = payload(6, H).float().to(torch.float8_e4m3fn) if H == 20 else payload(6, H)
        got = ops.permute(x, idx, 3, impl=f"triton@1024:4:1024:4:{tma}")
        assert_same_permute(got, ops.permute(x, idx, 3, impl="torch"))
        assert spies[used].launches == before + 1, (H, tma)


ROWS_CASES = [  # T, H, K, E, pad, fp8, copy_rows; bf16 rows of H * 2 bytes, fp8 rows of H bytes
    (37, 24, 4, 6, 0, False, 4),     # T not a multiple of copy_rows, E not dividing T
    (5, 8, 1, 3, 0, False, 8),       # K 1, rows of 16 bytes, fewer tokens than one program
    (37, 20, 4, 6, 4, True, 2),      # fp8 (20-byte rows) with scales, padding
    (64, 40, 8, 16, 8, False, 16),   # K 8, padding
    (33, 16, 3, 300, 0, False, 4),   # E > T: most experts get no rows
    (70, 8, 4, 40, 8, True, 8),      # two rank blocks, three scan programs, padded, fp8
]


@pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_triton_interpreter")
@pytest.mark.parametrize("case", ROWS_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-rows{c[6]}")
def test_triton_matches_reference_rows(case, monkeypatch):
    """copy_rows > 1 (``_permute_copy_rows``, several tokens per program) against the torch
    reference, bitwise: masked slots, a token with no destination, probs, row count given or not."""
    T, H, K, E, pad, fp8, cr = case
    from moebench.ops import triton_impl
    spy = LaunchSpy(triton_impl._permute_copy_rows)
    monkeypatch.setattr(triton_impl, "_permute_copy_rows", spy)
    ops._status.clear()
    x, scales = payload(T, H), None
    if fp8:
        x, scales = x.float().to(torch.float8_e4m3fn), torch.rand(T, 3)
    idx = make_routing(T, K, E, mask_frac=0.3, seed=T * H + K)
    idx[T // 2] = -1
    probs = torch.rand(T, K)
    want = ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl="torch", probs_TK=probs)
    bh, cs = (1024, 1) if ROWS_CASES.index(case) % 2 else (8, 0)   # one chunk per row, streaming; or
    impl = f"triton@{bh}:4:1024:4:0:{cs}:256:4:16:128:4:1:{cr}"      # several chunks, plain access
    assert_same_permute(ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl=impl, probs_TK=probs), want)
    assert_same_permute(ops.permute(x, idx, E, scales_TS=scales, pad_multiple=pad, impl=impl, probs_TK=probs,
                                    num_out_rows=want.x_RH.shape[0]), want)
    assert spy.launches == 2


def test_tma_desc_choice(monkeypatch):
    """Host side of the TMA path (no kernel runs): when it applies, and the box it picks."""
    pytest.importorskip("triton")
    from moebench.ops import triton_impl as ti
    if not INTERPRET:
        assert not ti._tma_device(torch.device("cpu"))
    assert ti._tma_desc(torch.zeros(4, 6, dtype=torch.int32), 4, 6, 1024) is None     # 24-byte rows
    assert ti._tma_desc(torch.zeros(4, 8, dtype=torch.int16), 4, 8, 1024) is None     # not int32 words
    ow = torch.zeros(5, 3584, dtype=torch.int32)                               # H 7168 bf16
    for bh, nb in ((1024, 4), (128, 1), (1536, 4), (4096, 16), (8192, 16)):
        desc, NC, BW, NB, BB = ti._tma_desc(ow, 5, 3584, bh)
        assert (NC, BW, NB, BB) == (14, 256, nb, 256), bh
        assert list(desc.shape) == [5, 14, 256] and list(desc.strides) == [3584, 256, 1]
        assert list(desc.block_shape) == [1, nb, 256]
    desc, NC, BW, NB, BB = ti._tma_desc(torch.zeros(5, 500, dtype=torch.int32), 5, 500, 1024)
    assert (NC, BW, NB, BB) == (1, 500, 1, 256) and list(desc.strides) == [500, 500, 1]


@pytest.mark.skipif(INTERPRET or torch.cuda.is_available(), reason="runs the cases directly")
@pytest.mark.slow
def test_triton_interpreter():
    """Triton's interpreter is chosen when triton.jit runs, so run the cases in a fresh process."""
    pytest.importorskip("triton")
    bad = run_interpreted(__file__, ("triton_matches_reference",
                                     "triton_route_knobs or hypothesis_triton or triton_tma"))
    assert not bad, bad


# ---------------------------------------------------------------- megatron-core as a second oracle
def _moe_utils():
    pytest.importorskip("triton")  # megatron-core's import needs it
    return pytest.importorskip("megatron.core.transformer.moe.moe_utils")


def test_reference_matches_megatron():
    mu = _moe_utils()
    T, H, K, E = 50, 16, 4, 8
    x = payload(T, H)
    idx = make_routing(T, K, E, seed=11)
    valid = idx >= 0
    routing_map = torch.zeros(T, E, dtype=torch.bool)
    routing_map[torch.arange(T)[:, None].expand(T, K)[valid], idx[valid]] = True
    w = torch.rand(T, K)
    probs = torch.zeros(T, E)
    probs[torch.arange(T)[:, None].expand(T, K)[valid], idx[valid]] = w[valid]
    m_out, _, m_sorted = mu.permute(x, routing_map, num_out_tokens=int(valid.sum()))[:3]
    p = ops.permute(x, idx, E, impl="torch")
    assert torch.equal(p.x_RH, m_out)
    y = payload(p.x_RH.shape[0], H, seed=9)
    m_un = mu.unpermute(y, m_sorted, x.shape, probs=probs, routing_map=routing_map)
    torch.testing.assert_close(ops.unpermute(y, p.row_map_TK, w, impl="torch"), m_un,
                               rtol=1e-2, atol=1e-2)


def test_sort_chunks_matches_megatron():
    mu = _moe_utils()
    sizes = torch.tensor([3, 0, 2, 5, 1, 4])
    order = torch.tensor([4, 1, 5, 0, 3, 2])
    x = payload(int(sizes.sum()), 8)
    assert torch.equal(ops.sort_chunks_by_idxs(x, sizes, order, impl="torch"),
                       mu.sort_chunks_by_idxs(x, sizes, order)[0])


# ---------------------------------------------------------------- properties
routing_params = st.tuples(st.integers(1, 40), st.integers(1, 33), st.integers(1, 6),
                           st.integers(1, 12), st.sampled_from([0, 0, 2, 8]),
                           st.floats(0, 1), st.integers(0, 2**16))


@settings(max_examples=40, deadline=None)
@given(routing_params)
def test_hypothesis_reference_properties(params):
    T, H, K, E, pad, mask_frac, seed = params
    idx = make_routing(T, K, E, mask_frac=mask_frac, seed=seed, distinct=K <= E and seed % 2 == 0)
    x = payload(T, H, seed=seed)
    p = ops.permute(x, idx, E, pad_multiple=pad, impl="torch")
    valid = idx >= 0
    counts = torch.bincount(idx[valid], minlength=E)
    want_tpe = (counts + pad - 1) // pad * pad if pad else counts
    assert p.tokens_per_expert.tolist() == want_tpe.tolist()
    assert p.x_RH.shape == (int(want_tpe.sum()), H)
    assert bool(((p.row_map_TK >= 0) == valid).all())
    rows = p.row_map_TK[valid].long()
    assert rows.unique().numel() == rows.numel()                 # no two slots share a row
    tok = torch.arange(T)[:, None].expand(T, K)[valid]
    assert torch.equal(p.x_RH[rows], x[tok])                    # every slot carries its token
    # Megatron order: by expert, then token index (then k)
    key = idx[valid] * (T * K) + torch.arange(T * K).view(T, K)[valid]
    assert torch.equal(torch.argsort(rows), torch.argsort(key))
    pad_rows = torch.ones(p.x_RH.shape[0], dtype=torch.bool)
    pad_rows[rows] = False
    assert not p.x_RH[pad_rows].float().any()
    # unpermute with unit weights on distinct rows sums each token's valid copies
    out = ops.unpermute(p.x_RH, p.row_map_TK, torch.ones(T, K), impl="torch")
    torch.testing.assert_close(out.float(), (x.float() * valid.sum(1, keepdim=True)).bfloat16().float(),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not INTERPRET, reason="runs in the subprocess of test_triton_interpreter")
@settings(max_examples=8, deadline=None)
@given(routing_params)
def test_hypothesis_triton(params):
    T, H, K, E, pad, mask_frac, seed = params
    ops._status.clear()
    idx = make_routing(T, K, E, mask_frac=mask_frac, seed=seed, distinct=seed % 2 == 0)
    x = payload(T, H, seed=seed)
    assert_same_permute(ops.permute(x, idx, E, pad_multiple=pad, impl="triton"),
                        ops.permute(x, idx, E, pad_multiple=pad, impl="torch"))


def test_variants_are_part_of_the_impl_string():
    """cuda@V / triton@... pick kernel variants per call; no module state changes."""
    x, idx = payload(6, 16), make_routing(6, 2, 4, seed=3)
    with pytest.raises(ValueError, match="has no variants"):
        ops.permute(x, idx, 4, impl="torch@1")
    with pytest.raises(ValueError, match="has no variants"):
        ops.sort_chunks_by_idxs(x, [3, 3], [1, 0], impl="triton@1024")
    pytest.importorskip("triton")
    from moebench.ops import triton_impl as ti
    assert ti.knobs("") is ti.DEFAULT_KNOBS
    assert ti.knobs("2048:8") == ti.DEFAULT_KNOBS._replace(copy_bh=2048, copy_warps=8)
    assert ti.knobs("1:2:3:4:1") == ti.DEFAULT_KNOBS._replace(copy_bh=1, copy_warps=2, unperm_bh=3,
                                                              unperm_warps=4, copy_tma=1)
    assert ti.knobs("1:2:3:4:0:1").copy_cs == 1
    assert ti.knobs("1:2:3:4:0:1:512:8:16:128:2:0")[6:] == (512, 8, 16, 128, 2, 0, 1)
    assert ti.knobs("1:2:3:4:0:1:512:8:16:128:2:0:8").copy_rows == 8 and ti.DEFAULT_KNOBS.copy_rows == 1
    with pytest.raises(ValueError, match="at most 13"):
        ti.knobs("1:2:3:4:5:6:7:8:9:10:11:12:13:14")
    with pytest.raises(ValueError, match="scan_eb must be a power of 2"):
        ti.knobs("1:2:3:4:0:1:512:8:24")
    with pytest.raises(ValueError, match="copy_rows must be a power of 2"):
        ti.knobs("1024:4:1024:4:0:1:256:4:16:128:4:1:3")
    with pytest.raises(ValueError, match="copy_rows must be at most 64"):
        ti.knobs("1024:4:1024:4:0:1:256:4:16:128:4:1:128")
    with pytest.raises(ValueError, match="no TMA form"):
        ti.knobs("1024:4:1024:4:1:1:256:4:16:128:4:1:4")
    with pytest.raises(ValueError, match="power of 2"):     # refused when the impl string is resolved
        ops.permute(x, idx, 4, impl="triton@1024:4:1024:4:0:1:256:4:16:128:4:1:6")


# ---------------------------------------------------------------- CUDA variants (pure Python)
def test_cuda_variant_parse():
    """cuda@V[:C]: variant bits, rows per CTA of the rows kernel; malformed ones refused with the reason."""
    from moebench.ops import cuda_variant as cv
    assert cv.parse("") == cv.DEFAULT and cv.DEFAULT.rows_kernel and cv.DEFAULT.code == cv.UNFUSED | cv.ONE_INDEX | cv.PDL
    assert cv.parse("8192") == cv.CudaVariant(8192, 0) and not cv.parse("8192").rows_kernel
    assert cv.parse("0:8").code == 8 << 16 and cv.parse("16385:15").code == 16385 | 15 << 16
    assert cv.parse("16") .bits == 16 and cv.parse("1:0").rows == 0
    pdl = cv.parse(f"{cv.UNFUSED | cv.PDL}:8")        # the index kernels and the rows kernel as dependent launches
    assert pdl.rows_kernel and pdl.code == 49152 | 8 << 16
    assert cv.parse(str(cv.UNFUSED | cv.ONE_INDEX | cv.PDL)).rows_kernel     # and the index work in one launch
    for bad, why in (("0:17", "rows per CTA must be 1-16"), ("0:-1", "rows per CTA must be"),
                     ("1:2:3", "want V or V:C"), ("x", "integers"), ("65536", "rows per CTA go after a colon"),
                     ("-1", "variant bits must be"), ("16:4", "pick another copy"), ("8192:8", "pick another copy"),
                     ("256:2", "pick another copy")):
        with pytest.raises(ValueError, match=why):
            cv.parse(bad)


def test_cuda_rows_shared_memory_rule():
    """Whether C rows of a shape fit one CTA's shared memory (H100 / H200: 227 KB per block)."""
    from moebench.ops import cuda_variant as cv
    assert cv.rows_problem(8, 14336, 8, 256) == ""               # the probe's best: 2 CTAs per SM
    assert cv.rows_problem(16, 14336, 8, 256) == ""              # 224 KB + 128: one CTA per SM
    assert "shared memory" in cv.rows_problem(16, 16384, 8, 256)
    assert "shared memory" in cv.rows_problem(8, 14336, 8, 256, smem_optin=101376)   # a smaller device
    assert "not a multiple of 16" in cv.rows_problem(4, 2002, 8, 64)
    assert "top-k" in cv.rows_problem(4, 1024, 33, 64) and "top-k" in cv.rows_problem(4, 1024, 0, 64)
    assert cv.rows_problem(1, 16, 1, 3) == "" and cv.rows_problem(0, 232448, 8, 256) != ""   # auto C 1 too big
    assert cv.rows_smem_bytes(1, 16, 1024) == 4096 + cv.STATIC_SMEM      # fused: E int32 histogram
    assert cv.rows_smem_bytes(1, 16, 2048) == 16 + cv.STATIC_SMEM        # E > 1024: index kernels, no histogram
    assert [cv.auto_rows(b) for b in (14336, 8192, 4096, 16, 300000)] == [8, 14, 16, 16, 1]
    assert cv.check("0:8", row_bytes=14336, topk=8, num_experts=256).rows == 8
    with pytest.raises(ValueError, match="shared memory"):
        cv.check("0:15", row_bytes=16384, topk=8, num_experts=256)


def test_cuda_variant_refused_when_parsed():
    """The impl string is checked when moebench.ops resolves it, on any machine (no GPU needed)."""
    x, idx = payload(6, 16), make_routing(6, 2, 4, seed=3)
    with pytest.raises(ValueError, match="rows per CTA must be 1-16"):
        ops.permute(x, idx, 4, impl="cuda@0:17")
    with pytest.raises(ValueError, match="pick another copy"):
        ops.unpermute(x, torch.zeros(6, 2, dtype=torch.int32), torch.rand(6, 2), impl="cuda@8192:4")
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):     # well-formed: CPU tensors are the problem
        ops.permute(x, idx, 4, impl="cuda@0:8")


def test_cuda_rows_per_cta_falls_back_with_a_note(monkeypatch):
    """An explicit C the shape cannot take runs with the default (auto) C and a warning: never a
    failed launch. Resolved once per shape."""
    from moebench.ops import cuda_impl
    monkeypatch.setattr(cuda_impl, "_smem_optin", lambda dev: 232448)
    monkeypatch.setattr(cuda_impl, "_CODES", {})
    dev = torch.device("cpu")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cuda_impl._permute_code("0:8", 14336, 8, 256, True, dev) == 8 << 16
        assert cuda_impl._permute_code("16384:15", 14336, 8, 256, True, dev) == 16384 | 15 << 16
        assert cuda_impl._permute_code("8192", 2002, 8, 256, False, dev) == 8192
        assert cuda_impl._permute_code("", 14336, 8, 256, True, dev) == 53248  # default: one index launch, PDL
    for args, why, code in ((("16384:16", 16384, 8, 256, True), "shared memory", 16384),
                            (("1:4", 2002, 8, 256, True), "multiple of 16", 1),
                            (("0:4", 14336, 8, 256, False), "aligned", 0)):
        with pytest.warns(UserWarning, match=why):
            assert cuda_impl._permute_code(*args, dev) == code
        with warnings.catch_warnings():
            warnings.simplefilter("error")               # once per shape
            assert cuda_impl._permute_code(*args, dev) == code


@pytest.mark.parametrize("T,K,E,G,pad", [(37, 4, 6, 5, 0), (64, 8, 16, 64, 8), (5, 1, 3, 2, 0),
                                         (300, 8, 256, 264, 0), (33, 3, 300, 7, 4)])
def test_fused_index_decomposition(T, K, E, G, pad):
    """The fused rows kernel's index math (csrc/permute_rows.cuh), modelled in torch: CTA c ranks the
    slots of tokens [c*T//G, (c+1)*T//G) per expert, the column scan turns the [G, E] counts into each
    CTA's first row per expert, the padded totals into expert starts; row = start + base + rank. It
    must give the reference's rows (Megatron order), whatever G. The kernel itself runs on a GPU only
    (tests/test_ops_gpu.py)."""
    from moebench.ops import torch_impl
    idx = make_routing(T, K, E, seed=T + G)
    flat = idx.reshape(-1)
    counts = torch.zeros(G, E, dtype=torch.int64)
    rank = torch.zeros(T * K, dtype=torch.int64)
    cta = torch.zeros(T * K, dtype=torch.int64)
    for c in range(G):
        s0, s1 = c * T // G * K, (c + 1) * T // G * K
        for s in range(s0, s1):                 # in slot order, as the warp's match_any chunks
            e = int(flat[s])
            cta[s] = c
            if e >= 0:
                rank[s] = counts[c, e]
                counts[c, e] += 1
    base = torch.cumsum(counts, 0) - counts      # exclusive over CTAs, per expert column
    total = counts.sum(0)
    padded = torch_impl.round_up(total, pad)
    start = torch.cumsum(padded, 0) - padded
    ok = flat >= 0
    e = flat.clamp(min=0)
    rows = torch.where(ok, start[e] + base[cta, e] + rank, -1)
    want_map, want_tpe = torch_impl.route(idx, E, pad)[:2]
    assert torch.equal(rows.view(T, K).int(), want_map) and torch.equal(padded.int(), want_tpe)


def test_every_csrc_header_is_hashed_into_the_jit_build():
    """A header left out of cuda_impl.HEADERS would let a cached extension outlive a change to it."""
    from moebench.ops import cuda_impl
    on_disk = {p.name for p in cuda_impl.CSRC.iterdir() if p.suffix in (".h", ".cuh")}
    assert set(cuda_impl.HEADERS) == on_disk
    assert all((cuda_impl.CSRC / s).is_file() for s in cuda_impl.SOURCES)
