"""What the fake native layer keeps per process: the objects behind the pointers it hands out (a communicator, a
group, a handle: `id()` of a Python object, live until destroyed), the native calls made, each group's config."""
import contextlib
import functools
import operator

import torch

CALLS: list[str] = []            # binding names, in call order ("create_group", "dispatch", "comm_destroy", ...)
GROUP_CONFIGS: list[dict] = []   # the GroupConfig each create_group read, field by field
ACTIVE = [0]                     # > 0 while a native call runs (a test tells the caller's host reads from the fake's)
_live: dict[int, object] = {}


def recorded(fn, convert=lambda a: a):
    """A replacement of a native binding: each call is listed in CALLS under the binding's name."""
    @functools.wraps(fn)
    def call(*args):
        CALLS.append(fn.__name__)
        ACTIVE[0] += 1
        try:
            return fn(*(convert(a) for a in args))
        finally:
            ACTIVE[0] -= 1
    return call


def native(fn):
    """A replacement of an NCCL EP binding (`nccl_ep.pyx:2621-2715`): recorded, and its arguments converted as
    Cython converts them for its `intptr_t` / `int` parameters (a None or a float is the binding's TypeError)."""
    return recorded(fn, _as_int)


def _as_int(a) -> int:
    try:
        return operator.index(a)
    except TypeError:
        raise TypeError(f"an integer is required (got type {type(a).__name__})") from None


def new_ptr(obj) -> int:
    _live[id(obj)] = obj
    return id(obj)


def lookup(ptr: int, kind: type, what: str):
    obj = _live.get(ptr)
    if not isinstance(obj, kind):
        raise RuntimeError(f"fake native layer: {what} {ptr:#x} is no live {kind.__name__} (the real library would "
                           "read freed or foreign memory)")
    return obj


def release(ptr: int) -> None:
    _live.pop(ptr, None)


@contextlib.contextmanager
def host_reads():
    """Counts the caller's reads of tensor values on the host (`tolist`, `item`: a host wait on a GPU) in the block,
    not the fake's own (gloo's object gather reads sizes): yields a one-item list, the count."""
    count, methods = [0], ("tolist", "item")
    own = {m: torch.Tensor.__dict__.get(m) for m in methods}
    def counting(name):
        real = getattr(torch.Tensor, name)
        def read(self, *args, **kwargs):
            count[0] += not ACTIVE[0]
            return real(self, *args, **kwargs)
        return read
    for m in methods:
        setattr(torch.Tensor, m, counting(m))
    try:
        yield count
    finally:
        for m in methods:
            if own[m] is None:
                delattr(torch.Tensor, m)
            else:
                setattr(torch.Tensor, m, own[m])
