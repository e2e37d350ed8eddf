"""The Triton kernels compile for sm_90 as the ops launch them, without a GPU: triton.compile with a
GPUTarget, the launches captured from triton_impl on meta tensors. The interpreter checks what the
kernels compute but not Triton's typing rules (a loop-carried variable that changes shape compiles
nowhere but on a GPU otherwise)."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
compiler = pytest.importorskip("triton.compiler")
backends = pytest.importorskip("triton.backends.compiler")

from moebench.ops import triton_impl  # noqa: E402

_PTR = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int64: "*i64", torch.int32: "*i32",
        torch.int16: "*i16", torch.uint8: "*u8"}


def _launches(monkeypatch, call) -> list:
    """The launches call makes, as on a Hopper GPU (programmatic dependent launches on)."""
    seen = []
    monkeypatch.setattr(triton_impl, "launch", lambda fn, grid, warps, *a, pdl=False: seen.append((fn, warps, a, pdl)))
    monkeypatch.setattr(triton_impl, "_hopper", lambda dev: True)
    try:
        call()
    except (NotImplementedError, RuntimeError):   # meta tensors stop the host part after the launches
        pass
    return seen


def _compile(fn, warps, args, pdl=False) -> None:
    sig, consts, attrs = {}, {}, {}
    for i, (p, v) in enumerate(zip(fn.params, args)):
        if p.is_constexpr or v is None or (type(v) is int and v == 1):
            sig[p.name] = "constexpr"
            consts[(i,)] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = _PTR[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif type(v) is bool:
            sig[p.name] = "u1"
        else:
            sig[p.name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = compiler.ASTSource(fn, sig, consts, attrs)
    k = triton.compile(src, target=backends.GPUTarget("cuda", 90, 32), options={"num_warps": warps, "launch_pdl": pdl})
    assert k.asm.get("cubin"), fn.__name__


# the copy_rows variants: tokens per program, a [CT, BH] tile of rows in flight (and the [CT, KP]
# row tile, K 8 and K 1)
ROWS = {"rows4": "1024:4:1024:4:0:1:256:4:16:128:4:1:4", "rows8-bh512": "512:8:1024:4:0:1:256:4:16:128:4:1:8"}


@pytest.mark.parametrize("case", ["bf16", "bf16-probs-pad", "fp8-scales-probs", "bf16-rows4", "bf16-rows8-bh512",
                                  "fp8-scales-probs-pad-rows4", "bf16-k1-rows8-bh512"])
def test_permute_kernels_compile_for_sm90(case, monkeypatch):
    T, H, K, E = 4096, 7168, 1 if "k1" in case else 8, 256
    meta = lambda shape, dt: torch.empty(shape, dtype=dt, device="meta")  # noqa: E731
    x = meta((T, H), torch.float8_e4m3fn if "fp8" in case else torch.bfloat16)
    scales = meta((T, H // 128), torch.float32) if "scales" in case else None
    probs = meta((T, K), torch.float32) if "probs" in case else None
    pad = 16 if "pad" in case else 0
    variant = next((v for name, v in ROWS.items() if case.endswith(name)), "")
    seen = _launches(monkeypatch, lambda: triton_impl.permute(x, meta((T, K), torch.int64), E, scales, pad,
                                                              T * K + E * 15 * (pad > 0), variant, probs))
    names = [fn.__name__ for fn, _, _, _ in seen]
    copy = "_permute_copy_rows" if variant else "_permute_copy"
    assert names[:3] == ["_route_rank", "_route_scan", copy], names
    assert [p for _, _, _, p in seen[:3]] == [False, True, True]   # scan and copy: dependent launches
    for fn, warps, args, pdl in seen:
        _compile(fn, warps, args, pdl)


def test_unpermute_and_sort_chunks_compile_for_sm90(monkeypatch):
    meta = lambda shape, dt: torch.empty(shape, dtype=dt, device="meta")  # noqa: E731
    y = meta((32768, 7168), torch.bfloat16)
    seen = _launches(monkeypatch, lambda: triton_impl.unpermute(y, meta((4096, 8), torch.int32),
                                                                meta((4096, 8), torch.float32)))
    seen += _launches(monkeypatch, lambda: triton_impl.sort_chunks_by_idxs(y, meta((64,), torch.int64),
                                                                          meta((64,), torch.int64)))
    assert [fn.__name__ for fn, _, _, _ in seen] == ["_unpermute", "_sort_chunks"]
    for fn, warps, args, pdl in seen:
        _compile(fn, warps, args, pdl)
