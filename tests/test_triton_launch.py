"""ops/triton_launch.py on CPU: the direct launch reuses a compiled kernel only for the same
specialisation key, and passes every argument through in the kernel's order."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moebench.ops import triton_launch as tl_


class FakeKernel:
    def __init__(self):
        self.function, self.packed_metadata, self.runs = "fn", "meta", []

    def run(self, *a):
        self.runs.append(a)


class FakeJit:
    """Stands in for a JITFunction: params (two tensors, an int, a constexpr); fn[grid](...) compiles."""

    def __init__(self):
        self.params = [SimpleNamespace(is_constexpr=c) for c in (False, False, False, True)]
        self.__name__ = "fake"
        self.compiles = []

    def __getitem__(self, grid):
        def compile_and_launch(*args, num_warps):
            self.compiles.append((grid, args, num_warps))
            return FakeKernel()
        return compile_and_launch


@pytest.fixture
def gpu_like(monkeypatch):
    monkeypatch.setattr(tl_, "_INTERPRET", False)
    monkeypatch.setattr(tl_, "_hooks_set", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1234, raising=False)


def test_second_call_launches_directly(gpu_like):
    fn, a, b = FakeJit(), torch.zeros(64), torch.zeros(64, dtype=torch.int32)
    tl_.launch(fn, (3,), 4, a, b, 32, 8)
    assert len(fn.compiles) == 1
    tl_.launch(fn, (5, 2), 4, a, b, 48, 8)            # same key: 48 % 16 == 0 like 32
    assert len(fn.compiles) == 1
    kernel = tl_._cache[(fn, tl_.key(fn, 4, (a, b, 48, 8)))]
    assert kernel.runs == [(5, 2, 1, 1234, "fn", "meta", None, None, None, a, b, 48, 8)]


@pytest.mark.parametrize("change", ["int_not_div16", "int_one", "int_i64", "constexpr", "warps",
                                    "dtype", "misaligned"])
def test_a_different_specialisation_compiles_again(gpu_like, change):
    fn, a, b = FakeJit(), torch.zeros(64), torch.zeros(64, dtype=torch.int32)
    args, warps = [a, b, 32, 8], 4
    tl_.launch(fn, (1,), warps, *args)
    if change == "int_not_div16":
        args[2] = 33
    elif change == "int_one":
        args[2] = 1
    elif change == "int_i64":
        args[2] = 1 << 40
    elif change == "constexpr":
        args[3] = 16
    elif change == "warps":
        warps = 8
    elif change == "dtype":
        args[1] = torch.zeros(64, dtype=torch.int64)
    else:
        args[0] = a[1:]                                # 4 bytes past a 16-byte boundary
    tl_.launch(fn, (1,), warps, *args)
    assert len(fn.compiles) == 2


def test_unknown_argument_kinds_and_hooks_take_the_ordinary_path(gpu_like, monkeypatch):
    fn, a = FakeJit(), torch.zeros(64)
    for _ in range(2):
        tl_.launch(fn, (1,), 4, a, object(), 32, 8)   # e.g. a TMA descriptor: no key
    assert len(fn.compiles) == 2
    monkeypatch.setattr(tl_, "_hooks_set", lambda: True)   # a profiler's launch hooks
    for _ in range(2):
        tl_.launch(fn, (1,), 4, a, a, 32, 8)
    assert len(fn.compiles) == 4
    with pytest.raises(TypeError, match="4 parameters"):
        tl_.key(fn, 4, (a, a, 32))
