"""A CPU stand-in for the `nccl` namespace of nccl4py + nccl-extensions 0.1.0 (only what `nccl.ep` needs).

`nccl.ep` simulates NCCL EP's Python facade (wheel `nccl/ep/*.py`) over a torch.distributed gloo group; `nccl.core`
is the communicator stub that `nccl.ep.interop.torch.get_nccl_comm_from_group` returns; `nccl._extensions.bindings.
nccl_ep` holds the error type the real Cython bindings raise. Put tests/fakes on sys.path to use it.
"""
