"""Setup cost (each record's `setup`, the table's `setup ms`): what a backend costs before its first useful call,
and what destroying and building it again costs (`--recreate`).

Why: NCCL EP's ep_bench times group and handle creation; sglang#24443 lost seconds to buffer re-construction;
DeepEP#571 asks what V2's buffer costs. A footprint does not tell a user that a backend compiles its kernels for
40 s at its first call or takes 2 s to rebuild a buffer. Per rank, host clock, the device synchronized after
each part (records/shapes.Setup):
- group_ms: init_process_group (harness/launch.py; it includes waiting for the last rank to join);
- build_ms: the backend constructed, validated and set up (stage.make_backend: buffers, handles, the exchange of
  their IPC handles, an NCCL EP group), the ranks' agreement after it left out;
- first_call_ms: the first dispatch and the first combine, those the oracle checks (JIT compiles, lazy
  allocations and registrations);
- with --recreate, after the timed views: destroy_ms (teardown), recreate_ms (built again) and
  recreate_first_call_ms (a first call again, checked against the oracle: a rebuilt buffer that returns wrong rows
  is FAIL).
"""
from __future__ import annotations

import time
import traceback

import torch

from . import memory, oracle
from .stage import CheckFailed, make_backend, stage


def ms_since(t0: float, device=None) -> float:
    """Milliseconds since t0 (perf_counter), the device synchronized first (CUDA)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return round((time.perf_counter() - t0) * 1e3, 3)


class FirstCalls:
    """A backend whose dispatch and combine are timed as they are called (the device synchronized after each):
    `figures()` keeps the first of each. Everything else is the backend's."""

    def __init__(self, b, device):
        self.b, self.device, self.ms = b, device, {}

    def _timed(self, key: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.ms.setdefault(key, ms_since(t0, self.device))
        return out

    def dispatch(self, *args):
        return self._timed("first_dispatch_ms", self.b.dispatch, *args)

    def combine(self, *args):
        return self._timed("first_combine_ms", self.b.combine, *args)

    def __getattr__(self, name):
        return getattr(self.b, name)

    def figures(self) -> dict:
        d = dict(self.ms)
        if len(d) == 2:
            d["first_call_ms"] = round(d["first_dispatch_ms"] + d["first_combine_ms"], 3)
        return d


def recreate(spec, name: str, ctx, b, inputs: tuple):
    """`b` destroyed and built again, timed, then one dispatch + combine on the new one checked against the oracle.
    inputs: the case's (payload, topk_idx, topk_w, scales). Returns (the new backend or None, {destroy_ms,
    recreate_ms, recreate_first_call_ms}, the error every rank agrees on or '')."""
    t0 = time.perf_counter()
    b.teardown()
    out = {"destroy_ms": ms_since(t0, ctx.device)}
    clock: dict = {}
    b2, err = make_backend(spec, name, ctx, clock)
    out["recreate_ms"] = clock.get("build_ms")
    if err:
        _release(b2)
        return None, out, f"after --recreate: {err}"
    first = FirstCalls(b2, ctx.device)

    def check():
        msg = oracle.check(first, spec.workload, ctx.rank, *inputs, ctx.device)[0]
        if msg:
            raise CheckFailed(msg)
    err = stage(check, ctx.group)
    out["recreate_first_call_ms"] = first.figures().get("first_call_ms")
    return b2, out, (f"after --recreate: {err}" if err else "")


def _release(b) -> None:
    """A backend whose rebuild failed: released as far as it goes (the failure already reported is what matters)."""
    try:
        if b is not None:
            b.teardown()
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def gather(clock: dict, first: FirstCalls | None, group) -> list[dict]:
    """Every rank's setup figures (clock: group_ms, build_ms, ... ; first: its first calls), on every rank."""
    return memory.gather({**clock, **(first.figures() if first is not None else {})}, group)
