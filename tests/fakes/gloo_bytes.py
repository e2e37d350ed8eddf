"""What the stand-ins of DeepEP (V1, V2) and NCCL EP share: tensors moved between CPU ranks over a gloo group.

Tensors travel as raw bytes through `all_gather_object` (gloo's object pickling cannot carry float8): slow, and
only for small test shapes. Every fake finds this module because tests/fakes is on the rank processes' path.
"""
import torch
import torch.distributed as dist


class Bytes:
    """A tensor as its raw bytes (its dtype and shape kept)."""
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
    dist.all_gather_object(out, _pack(obj, lambda v: Bytes(v) if torch.is_tensor(v) else v), group=group)
    return [_pack(o, lambda v: v.tensor() if isinstance(v, Bytes) else v) for o in out]


def u8(t):
    """A byte view of a tensor's rows (index copies of float8 go through it on CPU)."""
    return t.view(torch.uint8)


def garbage(t):
    """What torch.empty would hold, made visible: NaN in floating tensors (0x7F bytes for float8), -1 elsewhere."""
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        u8(t).fill_(0x7F)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-1)
