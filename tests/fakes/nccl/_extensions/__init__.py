"""Stub of `nccl._extensions` (nccl-extensions 0.1.0): only `bindings.nccl_ep`'s error type and version calls."""
