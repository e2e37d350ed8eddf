"""Bring-up and container-acceptance checks, one registry (`python -m moebench.check`).

Modules: registry (keys, selection, the runner), child (crash-contained child processes),
system (env, gpu, nvlink, nic), transport (ibgda, gdr, gdrcopy, the NVSHMEM environment), comm (p2p,
nccl), nvshmem, ep (deepep.*, hybridep.*, megatron), nccl_ep (ncclep.*, deepep-v2.*), fault (fault.BACKEND, only when
named), baseline (regression gate), output (JSON / JUnit). Importing this package registers every check; baseline
runs last.
"""
from . import system, transport, comm, nvshmem, ep, nccl_ep, fault, baseline  # noqa: F401,I001 - registration order
from .registry import FAIL, PASS, REGISTRY, WAIVED, Context, Result, SelectionError, run, select

REGISTRY["baseline"] = REGISTRY.pop("baseline")     # the gate reads every other check's rows: last

__all__ = ["FAIL", "PASS", "REGISTRY", "WAIVED", "Context", "Result", "SelectionError", "run", "select"]
