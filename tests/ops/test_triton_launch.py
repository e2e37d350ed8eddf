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
        def compile_and_launch(*args, num_warps, **opts):
            self.compiles.append((grid, args, num_warps, opts))
            return FakeKernel()
        return compile_and_launch


@pytest.fixture
def gpu_like(monkeypatch):
    monkeypatch.setattr(tl_, "_INTERPRET", False)
    monkeypatch.setattr(tl_, "_hooks_set", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1234, raising=False)


def test_second_call_launches_directly(gpu_like):
    """The second launch of a key calls the cached launcher with Triton's argument order."""
    fn, a, b = FakeJit(), torch.zeros(64), torch.zeros(64, dtype=torch.int32)
    tl_.launch(fn, (3,), 4, a, b, 32, 8)
    assert len(fn.compiles) == 1
    tl_.launch(fn, (5, 2), 4, a, b, 48, 8)            # same key: 48 % 16 == 0 like 32
    assert len(fn.compiles) == 1
    run, function, meta = tl_._cache[tl_.key(fn, 4, (a, b, 48, 8))]
    assert (function, meta) == ("fn", "meta")
    assert run.__self__.runs == [(5, 2, 1, 1234, "fn", "meta", None, None, None, a, b, 48, 8)]


CHANGES = {  # name: (argument index or "warps" / "device", value before, value after)
    "int_not_div16": (2, 32, 33), "int_one": (2, 32, 1), "int_i64": (2, 32, 1 << 40),
    "int_u64": (2, 1 << 62, 1 << 63),            # both divisible by 16: i64 -> u64
    "constexpr": (3, 8, 16), "constexpr_type": (3, 8, 8.0),   # == 8, but Triton compiles again
    "warps": ("warps", 4, 8), "device": ("device", 0, 1), "pdl": ("pdl", False, True),
    "dtype": (1, torch.zeros(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int64)),
    "misaligned": (0, torch.zeros(64), torch.zeros(64)[1:]),     # 4 bytes past a 16-byte boundary
    "none": (1, torch.zeros(64, dtype=torch.int32), None),       # an absent pointer: a constexpr
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_different_specialisation_compiles_again(gpu_like, change, monkeypatch):
    """Each launch is made twice: the second of each pair is direct, the change compiles again."""
    fn = FakeJit()
    where, before, after = CHANGES[change]
    for value in (before, after):
        args, warps, dev, pdl = [torch.zeros(64), torch.zeros(64, dtype=torch.int32), 32, 8], 4, 0, False
        if where == "warps":
            warps = value
        elif where == "device":
            dev = value
        elif where == "pdl":
            pdl = value
        else:
            args[where] = value
        monkeypatch.setattr(torch.cuda, "current_device", lambda: dev)
        tl_.launch(fn, (1,), warps, *args, pdl=pdl)
        tl_.launch(fn, (1,), warps, *args, pdl=pdl)
    assert len(fn.compiles) == 2
    if where == "pdl":   # a dependent launch is a compile option (launch_pdl), the plain one passes none
        assert [c[3] for c in fn.compiles] == [{}, {"launch_pdl": True}]


def _values():
    """Arguments around every specialisation boundary Triton has (ints, tensors, None, bools, floats)."""
    t = torch.zeros(16)
    ints = [0, 1, 2, 15, 16, 17, -1, -16, 48, (1 << 31) - 16, (1 << 31) - 1, 1 << 31, -(1 << 31),
            -(1 << 31) - 1, -(1 << 31) - 16, (1 << 63) - 16, 1 << 63, (1 << 63) + 16, -(1 << 63)]
    tensors = [t, t[1:], t[4:], torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)[1:],
               torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.uint8)[3:],
               torch.nn.Parameter(torch.zeros(4))]
    return ints + tensors + [None, True, False, 1.0, 2.5]


def test_spec_agrees_with_triton():
    """Two arguments share a ``_spec`` exactly when Triton's own specialisation of them agrees
    (native_specialize_impl, what JITFunction.run's binder calls), so the cache can neither reuse
    a kernel Triton would recompile nor miss one it would reuse."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:  # pragma: no cover - older Triton: no native specialisation to compare with
        pytest.skip("no triton native_specialize_impl")
    vals = _values()
    ours = [tl_._spec(v) for v in vals]
    theirs = [native_specialize_impl(BaseBackend, v, False, True, True) for v in vals]
    for i in range(len(vals)):
        for j in range(len(vals)):
            assert (ours[i] == ours[j]) == (theirs[i] == theirs[j]), (vals[i], vals[j], theirs[i], theirs[j])


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


def test_hooks_set_reads_an_empty_hook_chain_as_no_hook(monkeypatch):
    """Triton >= 3.5 holds launch hooks in a HookChain that is never None; an empty one is no hook
    (reading it as set sent every launch down Triton's slow path), one with a call is."""
    knobs = pytest.importorskip("triton.knobs")
    rt = knobs.runtime
    if not hasattr(knobs, "HookChain"):
        pytest.skip("this Triton keeps hooks as plain callables")
    monkeypatch.setattr(rt, "launch_enter_hook", knobs.HookChain())
    monkeypatch.setattr(rt, "launch_exit_hook", knobs.HookChain())
    assert not tl_._hooks_set()
    chain = knobs.HookChain()
    chain.add(lambda *a: None)
    monkeypatch.setattr(rt, "launch_enter_hook", chain)
    assert tl_._hooks_set()
    monkeypatch.setattr(rt, "launch_enter_hook", lambda *a: None)     # an older Triton's plain hook
    assert tl_._hooks_set()
