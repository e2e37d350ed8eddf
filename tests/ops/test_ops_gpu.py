"""GPU tier of moebench.ops: every implementation against the torch reference at the benchmark
shapes (bitwise for permute, bf16 tolerance for unpermute), fp8 + scales + padding, sort_chunks,
and torch.library.opcheck per implementation."""
from __future__ import annotations

import pytest
import torch

import moebench.ops as ops

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPES = [(4096, 7168, 8, 256), (16384, 7168, 8, 256), (8192, 2048, 8, 128), (8192, 4096, 8, 128),
          (77, 1000, 6, 10)]   # odd: H not a multiple of the vector width, K < 8


def _impls():
    status = ops.impl_status()
    return [name for name in ("triton", "cuda") if status[name][0]] or ["torch"]


def routing(T, K, E, mask_frac=0.05, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    idx = torch.topk(torch.rand(T, E, device=device, generator=g), K, dim=1).indices
    idx[torch.rand(T, K, device=device, generator=g) < mask_frac] = -1
    return idx


def check_permute(a: ops.Permuted, b: ops.Permuted):
    assert torch.equal(a.row_map_TK, b.row_map_TK)
    assert torch.equal(a.tokens_per_expert, b.tokens_per_expert)
    assert a.x_RH.shape == b.x_RH.shape
    assert torch.equal(a.x_RH.view(torch.uint8), b.x_RH.view(torch.uint8))
    if b.scales_RS is not None:
        assert torch.equal(a.scales_RS, b.scales_RS)
    if b.probs_R is not None:
        assert torch.equal(a.probs_R, b.probs_R)


def test_cuda_extension_loads():
    ok, why = ops.impl_status()["cuda"]
    assert ok, why
    assert ops.best_impl("cuda") == "cuda"
    assert ops.best_impl("cuda", "unpermute") == "triton"     # measured faster (PREFERENCE)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", ["triton", "cuda"])
def test_impl_matches_reference(impl, shape):
    if impl not in _impls():
        pytest.skip(f"{impl} unavailable: {ops.impl_status()[impl][1]}")
    T, H, K, E = shape
    x = torch.randn(T, H, device="cuda").bfloat16()
    idx = routing(T, K, E, seed=T + H)
    want = ops.permute(x, idx, E, impl="torch")
    got = ops.permute(x, idx, E, impl=impl)
    check_permute(got, want)
    w = torch.rand(T, K, device="cuda")
    want_p = ops.permute(x, idx, E, impl="torch", probs_TK=w)
    got_n = ops.permute(x, idx, E, impl=impl, num_out_rows=want.x_RH.shape[0], probs_TK=w)
    check_permute(got_n, want_p)
    counted = ops.permute(x, idx, E, impl=impl, probs_TK=w, counts_to_host=True)
    check_permute(counted, want_p)
    assert counted.tokens_per_expert_host == want.tokens_per_expert.tolist()
    y = torch.randn_like(want.x_RH)
    ref = ops.unpermute(y, want.row_map_TK, w, impl="torch")
    out = ops.unpermute(y, want.row_map_TK, w, impl=impl)
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("impl", ["triton", "cuda"])
@pytest.mark.parametrize("pad", [0, 16, 128])
def test_fp8_scales_padding(impl, pad):
    if impl not in _impls():
        pytest.skip(f"{impl} unavailable")
    T, H, K, E = 2048, 7168, 8, 256
    x = torch.randn(T, H, device="cuda").to(torch.float8_e4m3fn)
    s = torch.rand(T, H // 128, device="cuda")
    idx = routing(T, K, E, mask_frac=0.2, seed=pad)
    w = torch.rand(T, K, device="cuda")
    want = ops.permute(x, idx, E, scales_TS=s, pad_multiple=pad, impl="torch", probs_TK=w)
    got = ops.permute(x, idx, E, scales_TS=s, pad_multiple=pad, impl=impl, probs_TK=w)
    check_permute(got, want)
    idx32 = idx.int()
    check_permute(ops.permute(x, idx32, E, scales_TS=s, pad_multiple=pad, impl=impl, probs_TK=w), want)


# csrc variants (csrc/moe_permute.h, ops/cuda_variant.py): 0 the rows kernel with the index work fused
# in, auto rows per CTA; V:C with C rows per CTA (1, 4, 8, 15, 16); 1 without L2 hints; 16384 (the
# default) the rows kernel after the index kernels; 49152 the same as programmatic dependent launches; 20480
# the index work in one launch (53248: and PDL); 8192 the one-row bulk kernel, the previous default (+1 no hints,
# +32/+96 two/four buffers, +128 4 KB chunks); 16 the per-warp register copy; 256 the
# destination-order gather (+512 plain stores, +1024/2048/3072 tiles of 128/2048/8192 tokens).
# Triton: copy_tma 1 (the defaults, copy_tma 0 and copy_cs 1, are test_impl_matches_reference's); the
# index-kernel knobs and pdl 0 / 1; copy_rows 2 / 4 / 8.
CUDA_COPY_VARIANTS = ["0", "0:1", "0:4", "0:8", "0:15", "0:16", "1", "1:8", "16384", "16384:8", "16384:15", "49152", "20480", "53248",
                      "8192", "8193", "8224", "8288", "8320", "16", "26", "256", "768", "1280", "2304", "3328"]
COPY_VARIANTS = [f"cuda@{v}" for v in CUDA_COPY_VARIANTS] + [
    "triton@1024:4:1024:4:1",
    "triton@1024:4:1024:4:0:1:256:4:64:64:4:0", "triton@1024:4:1024:4:1:1:512:8:16:128:2:1",
    "triton@1024:4:1024:4:0:1:256:1:32:64:8:1", "triton@1024:4:1024:4:0:1:256:4:16:128:4:1:2",
    "triton@1024:4:1024:4:0:1:256:4:16:128:4:1:4", "triton@512:8:1024:4:0:1:256:4:16:128:4:1:8"]
# (T, H, K, E): the benchmark shape; H 1000 (2000-byte rows); E 4096 > 1024 (the rows kernel after the
# index kernels); K 1. The CUDA variants and Triton's copy_rows 4 also get rows of 16 bytes (H 8) with T
# not a multiple of C, and rows of 2002 bytes (not a multiple of 16: another copy takes them). Each
# (Triton variant, shape) is a compile on a fresh machine, so the other Triton variants take the
# benchmark shape and the small odd one only: `pytest -m gpu` has to fit in 5 minutes on one H200.
COPY_SHAPES = [(4096, 7168, 8, 256), (77, 1000, 6, 10), (5, 64, 2, 4096), (3000, 2048, 1, 7)]
EDGE_SHAPES = [(333, 8, 3, 5), (100, 1001, 4, 64)]


def _copy_shapes(variant):
    if variant.startswith("cuda@") or variant.endswith(":1:4"):
        return COPY_SHAPES + EDGE_SHAPES
    return [COPY_SHAPES[0], EDGE_SHAPES[0]]


def _copy_cases():
    for v in COPY_VARIANTS:
        for shape in _copy_shapes(v):
            yield pytest.param(v, shape, id=f"{v}-{'x'.join(map(str, shape))}")


@pytest.mark.parametrize("variant,shape", list(_copy_cases()))
def test_copy_variants(variant, shape):
    if variant.split("@")[0] not in _impls():
        pytest.skip(f"{variant} unavailable")
    T, H, K, E = shape
    x = torch.randn(T, H, device="cuda").bfloat16()
    idx = routing(T, K, E, mask_frac=0.1, seed=len(variant))
    idx[T // 2] = -1                                              # a token with no destination
    w = torch.rand(T, K, device="cuda")
    want = ops.permute(x, idx, E, impl="torch", probs_TK=w)
    check_permute(ops.permute(x, idx, E, impl=variant, probs_TK=w), want)
    if variant.startswith("cuda@"):   # the row count given (no wait), and counts to the host (the fused
        # kernel's polled host words); Triton's paths for these are variant-independent (test above)
        check_permute(ops.permute(x, idx, E, impl=variant, probs_TK=w, num_out_rows=want.x_RH.shape[0]), want)
        counted = ops.permute(x, idx, E, impl=variant, counts_to_host=True)
        assert counted.tokens_per_expert_host == want.tokens_per_expert.tolist()
    x8, s = x.to(torch.float8_e4m3fn), torch.rand(T, 3, device="cuda")
    check_permute(ops.permute(x8, idx, E, scales_TS=s, pad_multiple=16, impl=variant),
                  ops.permute(x8, idx, E, scales_TS=s, pad_multiple=16, impl="torch"))


def _kernel_names(fn) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.key for e in prof.key_averages())


@pytest.mark.parametrize("variant,want,absent", [
    ("", "permute_rows_kernel<false", "route_scan_kernel"),             # default: after the one index launch
    ("0", "permute_rows_kernel<true", "route_rank_kernel"),             # the index work fused in: one launch
    ("8192", "permute_bulk_kernel", "permute_rows_kernel")])            # the previous default
def test_cuda_rows_kernel_is_the_default(variant, want, absent):
    """Which copy runs at the benchmark shape (profiler kernel names)."""
    if "cuda" not in _impls():
        pytest.skip("cuda unavailable")
    T, H, K, E = 4096, 7168, 8, 256
    x = torch.randn(T, H, device="cuda").bfloat16()
    idx = routing(T, K, E, mask_frac=0.0)                              # R = T * K
    impl = "cuda@" + variant if variant else "cuda"
    ops.permute(x, idx, E, impl=impl)                                 # build / warm up outside the profile
    names = _kernel_names(lambda: ops.permute(x, idx, E, impl=impl, num_out_rows=T * K))
    assert want in names and absent not in names, names


def test_cuda_rows_that_do_not_fit_fall_back_with_a_note():
    """cuda@0:15 with 16 KB rows needs 240 KB of shared memory per CTA: runs with the default rows per
    CTA, warns, and is still exact."""
    if "cuda" not in _impls():
        pytest.skip("cuda unavailable")
    T, H, K, E = 300, 8192, 8, 64
    x = torch.randn(T, H, device="cuda").bfloat16()
    idx = routing(T, K, E, mask_frac=0.1)
    with pytest.warns(UserWarning, match="shared memory"):
        got = ops.permute(x, idx, E, impl="cuda@0:15")
    check_permute(got, ops.permute(x, idx, E, impl="torch"))


@pytest.mark.parametrize("impl", ["triton", "cuda"])
@pytest.mark.parametrize("H", [7168, 1001])
def test_sort_chunks(impl, H):
    if impl not in _impls():
        pytest.skip(f"{impl} unavailable")
    C = 256
    sizes = torch.randint(0, 200, (C,), device="cuda")
    sizes[::7] = 0
    order = torch.randperm(C, device="cuda")
    x = torch.randn(int(sizes.sum()), H, device="cuda").bfloat16()
    assert torch.equal(ops.sort_chunks_by_idxs(x, sizes, order, impl=impl),
                       ops.sort_chunks_by_idxs(x, sizes, order, impl="torch"))


@pytest.mark.parametrize("impl", ["torch", "triton", "cuda"])
def test_opcheck(impl):
    if impl != "torch" and impl not in _impls():
        pytest.skip(f"{impl} unavailable")
    T, H, K, E = 64, 256, 4, 16
    x = torch.randn(T, H, device="cuda").bfloat16()
    idx = routing(T, K, E, mask_frac=0.2)
    torch.library.opcheck(torch.ops.moebench.permute.default, (x, idx, E, None, 0, -1, impl))
    torch.library.opcheck(torch.ops.moebench.permute.default,
                          (x, idx, E, None, 0, -1, impl, torch.rand(T, K, device="cuda")))
    p = ops.permute(x, idx, E, impl="torch")
    torch.library.opcheck(torch.ops.moebench.unpermute.default,
                          (p.x_RH, p.row_map_TK, torch.rand(T, K, device="cuda"), impl))
    sizes = torch.tensor([10, 0, 30, 24], device="cuda")
    torch.library.opcheck(torch.ops.moebench.sort_chunks_by_idxs.default,
                          (x, sizes, torch.tensor([3, 1, 0, 2], device="cuda"), impl))


def test_triton_direct_launch_is_used_and_exact():
    """After the first call compiles, the ops' kernels launch through triton_launch's cache, with
    the same results (a wrong specialisation reused would show as a mismatch)."""
    if "triton" not in _impls():
        pytest.skip("triton unavailable")
    from moebench.ops import triton_launch
    for T, H, K, E in ((256, 7168, 8, 64), (33, 1001, 3, 5)):
        x = torch.randn(T, H, device="cuda").bfloat16()
        idx = routing(T, K, E, seed=T)
        want = ops.permute(x, idx, E, impl="torch")
        for n in (None, None, want.x_RH.shape[0]):
            check_permute(ops.permute(x, idx, E, impl="triton", num_out_rows=n), want)
    names = {k[0].__name__ for k in triton_launch._cache}
    assert {"_route_rank", "_route_scan", "_permute_copy"} <= names
    # and launched directly: once compiled, no call goes through JITFunction.run (Triton's slow path)
    from triton.runtime.jit import JITFunction
    slow = []
    orig = JITFunction.run
    JITFunction.run = lambda self, *a, **k: (slow.append(self.__name__), orig(self, *a, **k))[1]
    try:
        check_permute(ops.permute(x, idx, E, impl="triton"), want)
        ops.unpermute(want.x_RH, want.row_map_TK, torch.rand(T, K, device="cuda"), impl="triton")
        ops.unpermute(want.x_RH, want.row_map_TK, torch.rand(T, K, device="cuda"), impl="triton")
    finally:
        JITFunction.run = orig
    assert slow.count("_permute_copy") == 0 and slow.count("_unpermute") <= 1, slow
