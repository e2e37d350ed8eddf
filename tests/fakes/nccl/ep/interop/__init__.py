"""NCCL EP interop modules: PyTorch integration helpers (fake)."""
