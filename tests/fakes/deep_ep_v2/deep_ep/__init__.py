"""A CPU stand-in for DeepEP V2 (deepseek-ai/DeepEP branch epv2-release 018f21e, `__version__ = '2.0.0'`): put
tests/fakes/deep_ep_v2 on sys.path and `import deep_ep` gives it. `ElasticBuffer` / `EPHandle` are simulated over a
gloo group (buffers/elastic.py); the legacy `Buffer` that V2 installs also export is a stub (buffers/legacy.py).

Import-time NCCL check (v2 `deep_ep/__init__.py:46-68`, `check_nccl_so`): skipped only with EP_SUPPRESS_NCCL_CHECK=1.
The fake's "loaded libnccl" is named by env FAKE_DEEP_EP_V2_NCCL (a version such as 2.28.9): when set, the loaded
library is not byte-identical to the one DeepEP was built against, and the import raises the real
AssertionError("Invalid NCCL versions: <loaded> (loaded) v.s. <expected> (expected), ...").
Env FAKE_DEEP_EP_V2_JIT_FAIL=1 fails the run-time nvcc compile (see _sim.jit_compile).
"""
import os

import torch


def find_nccl_root() -> str:
    """v2 `deep_ep/utils/find_pkgs.py:8-68`: EP_NCCL_ROOT_DIR, then NCCL_DIR, then an nvidia-nccl wheel (here: a
    stand-in path for the 2.30.7 DeepEP needs)."""
    return os.environ.get("EP_NCCL_ROOT_DIR") or os.environ.get("NCCL_DIR") or "/opt/nccl-2.30.7/build"


def check_nccl_so():
    if int(os.environ.get('EP_SUPPRESS_NCCL_CHECK', 0)):
        return
    found = os.environ.get("FAKE_DEEP_EP_V2_NCCL")
    if not found:
        return                                  # the loaded libnccl is the linked one
    loaded_nccl_so = f"/usr/lib/x86_64-linux-gnu/libnccl.so.{found}"
    linked_nccl_so = f"{find_nccl_root()}/lib/libnccl.so"
    assert False, (f'Invalid NCCL versions: {loaded_nccl_so} (loaded) v.s. {linked_nccl_so} (expected), '
                   f'please contact Chenggang or Shangyan to upgrade PyTorch NCCL version')


check_nccl_so()

from .buffers.legacy import Buffer  # noqa: E402
from .buffers.elastic import ElasticBuffer, EPHandle  # noqa: E402
from .utils.event import EventOverlap, EventHandle  # noqa: E402
from .utils.envs import get_physical_domain_size, get_logical_domain_size  # noqa: E402


class Config:
    """Stub of `deep_ep._C.Config` (the legacy Buffer's config)."""
    def __init__(self, *args, **kwargs):
        self.args = args


topk_idx_t = torch.int64           # EP_NUM_TOPK_IDX_BITS unset: int64

__version__ = '2.0.0'
