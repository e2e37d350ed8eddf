"""What the fake DeepEP V2 shares: moving tensors over a gloo group and the library's failure forms.

Tensors travel as raw bytes through `all_gather_object` (gloo's object pickling cannot carry float8), as
tests/fakes/deep_ep/sim.py does: slow, and only for small test shapes. EP_HOST_ASSERT throws EPException, which
pybind11 maps to RuntimeError "Assertion exception (<file>:<line>): <cond>" (v2 `deep_ep/include/deep_ep/common/
exception.cuh:11-33`; no custom translator in `csrc/python_api.cpp`).
"""
import os

import torch
import torch.distributed as dist

CSRC = "/build/DeepEP/csrc"           # __FILE__ of the real build (an absolute path of the build tree)


class _Bytes:
    def __init__(self, t):
        self.dtype, self.shape = t.dtype, tuple(t.shape)
        self.data = t.contiguous().view(-1).view(torch.uint8).clone() if t.numel() else torch.empty(0, dtype=torch.uint8)

    def tensor(self):
        return self.data.view(self.dtype).view(self.shape) if self.data.numel() else torch.empty(self.shape, dtype=self.dtype)


def _pack(o, f):
    if isinstance(o, (tuple, list)):
        return type(o)(_pack(v, f) for v in o)
    if isinstance(o, dict):
        return {k: _pack(v, f) for k, v in o.items()}
    return f(o)


def gather(group, obj):
    """Every rank's `obj` (tensors inside tuples/lists/dicts carried byte for byte), in rank order."""
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, _pack(obj, lambda v: _Bytes(v) if torch.is_tensor(v) else v), group=group)
    return [_pack(o, lambda v: v.tensor() if isinstance(v, _Bytes) else v) for o in out]


def u8(t):
    return t.view(torch.uint8)


def garbage(t):
    """What torch.empty would hold, made visible: NaN in floating tensors (0x7F bytes for float8), -1 elsewhere."""
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        u8(t).fill_(0x7F)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-1)


def ep_assert(ok, file, line, cond):
    if not ok:
        raise RuntimeError(f"Assertion exception ({CSRC}/{file}:{line}): {cond}")


def fake_check(ok, what):
    """A check the real library makes in a way not traced here (or not at all): the fake refuses with ValueError."""
    if not ok:
        raise ValueError(f"fake deep_ep V2: {what}")


def jit_compile(name):
    """FAKE_DEEP_EP_V2_JIT_FAIL=1: the nvcc call of `csrc/jit/compiler.hpp:225-240` fails. The real one prints
    `NVCC compilation failed: <nvcc output>` with printf (stdout) and EP_HOST_ASSERTs; a failed compile is not
    cached, so every call that needs the kernel fails the same way."""
    if os.environ.get("FAKE_DEEP_EP_V2_JIT_FAIL") != "1":
        return
    d = os.path.join(os.environ.get("EP_JIT_CACHE_DIR", os.path.expanduser("~/.deep_ep")), "cache", f"kernel.{name}")
    os.write(1, (f"NVCC compilation failed: {d}/kernel.cu(12): catastrophic error: cannot open source file "
                 f"\"nccl_device.h\"\n  #include <nccl_device.h>\n                          ^\n\n1 catastrophic "
                 f"error detected in the compilation of \"{d}/kernel.cu\".\nCompilation terminated.\n\n").encode())
    ep_assert(False, "jit/compiler.hpp", 239, 'false and "NVCC compilation failed"')
