"""What Megatron needs patched to train here: megatron-core without Transformer Engine (the first
function), and Megatron-LM's training with several ranks sharing one GPU (functional runs, the rest).

Measured on the H200 (FACTS.md, "Megatron-LM on the H200"): pretrain_gpt.py trains alltoall,
flex/deepep and flex/hybridep with 2 ranks on one GPU once, before it runs,
- every rank sees the LOCAL_RANK of its GPU (Megatron calls torch.cuda.set_device(LOCAL_RANK));
- the default group is gloo (`--distributed-backend gloo`, in the arm's command) and so is every group
  Megatron creates, without NCCL's pg_options (NCCL refuses two ranks on one GPU);
- the collectives Megatron's DDP coalesces (`torch.distributed._coalescing_manager`) run one tensor at a
  time, since gloo has no coalesced all-reduce for CUDA tensors ("ProcessGroupGloo::allreduce_coalesced:
  unsupported device type cuda");
- DeepEP's NVML NVLink check is bypassed (it cannot answer for a GPU and itself; backends/deepep.py);
- HybridEP is told the ranks of its NVLink domain (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN, set by the
  arm's env from `megatron flags`).
Nothing here runs for one rank per GPU: then Megatron runs exactly as it ships.
"""
from __future__ import annotations

import contextlib
import contextvars
import os

import torch.distributed as dist

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("moebench_coalescing", default=None)
COALESCED = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def patch_megatron_without_te() -> None:
    """megatron-core 0.16.x references `te_general_gemm` in the router's gating GEMM without
    defining it when Transformer Engine is absent (NameError with moe_router_dtype set); 0.19
    defines it as None. Define it as None here, which selects Megatron's own torch path."""
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def local_rank_of_gpu(ranks_per_gpu: int) -> str:
    """LOCAL_RANK -> the local index of its GPU (ranks_per_gpu consecutive ranks share one)."""
    os.environ["LOCAL_RANK"] = str(int(os.environ.get("LOCAL_RANK", "0")) // ranks_per_gpu)
    return os.environ["LOCAL_RANK"]


def gloo_groups() -> None:
    """Every new process group on gloo, without NCCL options."""
    orig = dist.new_group
    if getattr(orig, "_moebench", False):
        return

    def new_group(*args, **kwargs):
        if kwargs.get("backend") in (None, "nccl"):
            kwargs["backend"] = "gloo"
        kwargs.pop("pg_options", None)
        return orig(*args, **kwargs)
    new_group._moebench = True
    dist.new_group = new_group


class _OneAtATime:
    """What `_coalescing_manager` yields: the ops issued inside ran one by one; wait() waits for them all."""

    def __init__(self):
        self.works = []

    def wait(self):
        works, self.works = self.works, []
        for w in works:
            w.wait()


@contextlib.contextmanager
def one_at_a_time(group=None, device=None, async_ops=False):
    """Stands in for torch.distributed._coalescing_manager: each collective issued inside runs on its own
    (asynchronously), and the manager waits for them at exit, or on wait() when async_ops."""
    cm = _OneAtATime()
    token = _ACTIVE.set(cm)
    try:
        yield cm
    finally:
        _ACTIVE.reset(token)
    if not async_ops:
        cm.wait()


def _collect(fn):
    def call(*args, **kwargs):
        cm = _ACTIVE.get()
        if cm is None:
            return fn(*args, **kwargs)
        kwargs["async_op"] = True
        work = fn(*args, **kwargs)
        if work is not None:
            cm.works.append(work)
        return work
    call._moebench = True
    return call


def uncoalesced_collectives() -> None:
    """torch.distributed._coalescing_manager -> one_at_a_time, in torch and where Megatron imported it.
    Call before Megatron is imported: its DDP binds the collectives to module names at import."""
    for name in COALESCED:
        fn = getattr(dist, name)
        if not getattr(fn, "_moebench", False):
            setattr(dist, name, _collect(fn))
    dist._coalescing_manager = one_at_a_time
    try:
        from megatron.core.distributed import param_and_grad_buffer as pgb
    except Exception:  # noqa: BLE001 - a Megatron without it has nothing to patch
        return
    pgb._coalescing_manager = one_at_a_time


def share_gpus(ranks_per_gpu: int) -> list[str]:
    """Everything above; returns what was changed, for the record."""
    local = local_rank_of_gpu(ranks_per_gpu)
    gloo_groups()
    uncoalesced_collectives()
    return [f"LOCAL_RANK -> {local} (the GPU's index; {ranks_per_gpu} ranks per GPU)",
            "process groups on gloo without NCCL options", "coalesced collectives run one tensor at a time"]
