"""validateDispatchRecipe and validateCombineRecipe (ext `nccl_ep.cc:329-549`): the first checks of a dispatch and a
combine, each failure a stderr line "NCCL EP warning: dispatch recipe N: ..." and ncclInvalidArgument.

Dispatch NONE: tokens bf16/fp16/fp32, outputs.tokens of their dtype, no scales. FWD (forward the caller's rows and
scales byte for byte): 16-byte rows of a raw wire dtype, scales [tokens, S] on both sides of a raw scale dtype in
16-byte rows, token bytes + scale bytes <= max_token_bytes, and the outputs' shapes: LL [L, R x M, H] and
[L, R x M, S] (expert-major); HT [rows, H] and [rows, S] with as many scale rows as token rows. DS_FP8E3M4 is not
simulated. Combine NONE: no scales, tokens bf16/fp16/fp32 (NVFP4 is not simulated).
"""
from __future__ import annotations

import torch

from . import failures as f

NONE, FWD, DS_FP8E3M4 = 0, 1, 2
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
WIRE = (F32, F16, BF16, *FP8)                          # validate_scales_forward_token_dtype (fp4x2 not simulated)
SCALE = (F32, F16, BF16, *FP8, torch.uint8)            # validate_scales_forward_scale_dtype


def dispatch(c, g) -> None:
    """`c`: the call's descriptors (ops.Call); `g`: the group."""
    def fail(message):
        f.invalid(f.INVALID_ARGUMENT, f"NCCL EP warning: dispatch recipe {c.recipe}: {message}")
    x, rx, s, rs = c.x, c.rx, c.s, c.rs
    if c.recipe == NONE:
        if x.dtype not in (BF16, F16, F32):
            fail("tokens has unsupported dtype")
        if rx is None:
            fail("outputs->tokens is required")
        if rx.dtype != x.dtype:
            fail("outputs->tokens dtype must match inputs->tokens")
        if s is not None:
            fail("inputs->scales must be null for NONE")
        if rs is not None:
            fail("outputs->scales must be null for NONE")
        return
    f.unsupported(c.recipe != DS_FP8E3M4, "DS_FP8E3M4 (LL in-kernel quantization) is not simulated")
    if c.recipe != FWD:
        fail("recipe is not implemented")
    if c.round_scales:
        fail("round_scales must be zero when scales are forwarded")
    if x.dtype not in WIRE:
        fail("tokens must use a supported raw wire dtype")
    if x.row_bytes == 0 or x.row_bytes % 16:
        fail("QUANT_FWD token rows must be 16-byte aligned for int4 transport")
    for d, message in ((s, "inputs->scales is required"), (rs, "outputs->scales is required"),
                       (rx, "outputs->tokens is required")):
        if d is None:
            fail(message)
    if any(d.data % 16 for d in (x, s, rx, rs)):
        fail("token and scale storage pointers/window offsets must be 16-byte aligned")
    if s.ndim != 2:
        fail("inputs->scales must be 2D [tokens, scales]")
    if s.dtype not in SCALE:
        fail("inputs->scales must use a supported raw scale dtype")
    if s.sizes[0] != x.sizes[0]:
        fail("inputs->scales dimension 0 must equal the token count")
    if s.sizes[1] == 0 or s.row_bytes % 16:
        fail("scale bytes per token must be non-zero and 16-byte aligned")
    if x.row_bytes + s.row_bytes > g.config["max_token_bytes"]:
        fail("token bytes plus scale bytes exceed the group token-byte limit")
    if not g.ht:
        slots = (g.local_experts, g.nranks * g.max_tokens)
        for out, given, name, layout in ((rx, x, "tokens", "layout"), (rs, s, "scales", "layout and input scales")):
            if out.dtype != given.dtype:
                fail(f"LL outputs->{name} dtype must match inputs->{name}")
            if out.ndim != 3:
                fail(f"LL outputs->{name} must be 3D")
            if out.sizes != (*slots, given.sizes[1]):
                fail(f"LL outputs->{name} dimensions do not match the selected {layout}")
        return
    if rx.dtype != x.dtype or rx.ndim != 2 or rx.sizes[1] != x.sizes[1]:
        fail("HT outputs->tokens must match the input dtype and physical row width")
    if rs.ndim != 2 or rs.dtype != s.dtype:
        fail("HT outputs->scales must match the input scale dtype and be 2D")
    if rs.sizes[0] != rx.sizes[0] or rs.sizes[1] != s.sizes[1]:
        fail("HT outputs->scales must match the token-row capacity and input scale count")


def combine(c) -> None:
    def fail(message):
        f.invalid(f.INVALID_ARGUMENT, f"NCCL EP warning: combine recipe {c.recipe}: {message}")
    f.unsupported(c.recipe == NONE, "the NVFP4 combine is not simulated")
    if c.s is not None:
        fail("inputs->scales must be null for NONE")
    if c.x.dtype not in (BF16, F16, F32):
        fail("tokens has unsupported dtype")
