"""Transport preflight for the clusters where DeepEP's low-latency and inter-node modes run: IBGDA
readiness, GPUDirect RDMA, GDRCopy and the NVSHMEM environment (what DeepEP and SGLang users keep
tripping on). Each reads the real /proc and /sys (env/transport.py; `--proc-root` / `--sysfs-root`
point them at fake trees in tests). Without RDMA NICs the NIC-side checks are WAIVED: a single node
reaches its peers over NVLink / CUDA IPC, and the reason says so.
"""
from __future__ import annotations

import os

from ..backends.deepep_ll import qp_depth_problem
from ..env import transport
from ..env.deepep import build_info
from .registry import Context, failed, passed, register, waived

NO_NIC = "no RDMA NICs under {root}/class/infiniband: single node, nothing crosses a NIC here"


def _roots(ctx: Context) -> tuple[str, str]:
    o = ctx.options
    return getattr(o, "proc_root", None) or "/proc", getattr(o, "sysfs_root", None) or "/sys"


def _nics(ctx: Context):
    return ctx.cached("transport.nics", lambda: transport.scan_nics(_roots(ctx)[1]))


@register("transport.ibgda", "IBGDA readiness: NVreg_EnableStreamMemOPs=1 and PeerMappingOverride=1 in the "
          "NVIDIA driver's parameters (NVSHMEM's GPU-initiated RDMA, DeepEP low-latency across nodes)")
def check_ibgda(ctx: Context):
    proc, sysfs = _roots(ctx)
    params = transport.driver_params(proc)
    if params is None:
        return waived(f"no {proc}/driver/nvidia/params: no NVIDIA driver loaded here")
    shown = {k: params.get(k) for k in ("EnableStreamMemOPs", "RegistryDwords")}
    problems = transport.ibgda_problems(params)
    if not _nics(ctx):
        return waived(NO_NIC.format(root=sysfs) + "; the driver " + ("is IBGDA-ready" if not problems else
                      "would not be IBGDA-ready: " + "; ".join(problems)), params=shown)
    if problems:
        return failed("; ".join(problems) + " (set them in /etc/modprobe.d and reload the driver)", params=shown)
    return passed("EnableStreamMemOPs=1, PeerMappingOverride=1: IBGDA-ready", params=shown)


@register("transport.gdr", "GPUDirect RDMA: nvidia_peermem loaded, or dma-buf (kernel >= 5.12, open kernel module)")
def check_gdr(ctx: Context):
    proc, sysfs = _roots(ctx)
    ok, how = transport.gpudirect_rdma(proc, sysfs)
    if not _nics(ctx):
        return waived(NO_NIC.format(root=sysfs) + f"; GPUDirect RDMA: {how}", available=ok)
    return passed(f"GPUDirect RDMA via {how}") if ok else failed(f"no GPUDirect RDMA: {how}; NICs cannot read or "
                                                                  "write GPU memory (modprobe nvidia_peermem)")


@register("transport.gdrcopy", "GDRCopy: the gdrdrv kernel module NVSHMEM's RDMA transports use")
def check_gdrcopy(ctx: Context):
    proc, sysfs = _roots(ctx)
    loaded = "gdrdrv" in transport.loaded_modules(proc, sysfs)
    if not _nics(ctx):
        return waived(NO_NIC.format(root=sysfs) + f"; gdrdrv {'loaded' if loaded else 'not loaded'}", loaded=loaded)
    return passed("gdrdrv loaded") if loaded else failed("gdrdrv not loaded: install GDRCopy and load its module "
                                                         "(DeepEP's NVSHMEM install guide asks for it)")


def judge_nvshmem_env(env: dict[str, str], shared_gpu: bool, nics: bool, ll_tokens: int) -> list[str]:
    """Settings that break DeepEP's NVSHMEM paths here."""
    out = []
    if env.get("NVSHMEM_DISABLE_P2P") == "1" and not nics:
        out.append("NVSHMEM_DISABLE_P2P=1 with no RDMA NIC: peers on this node become unreachable (DeepEP sets it "
                   "to 0 only when it may use NVLink in low-latency mode)")
    if env.get("NVSHMEM_DISABLE_NVLS") == "0":
        out.append("NVSHMEM_DISABLE_NVLS=0: NVLink multicast on (DeepEP turns it off)")
    problem = qp_depth_problem(ll_tokens, env)
    if problem:
        out.append(problem)
    if shared_gpu and env.get("NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "1":
        out.append("NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1 with ranks sharing a GPU: NVSHMEM warns this "
                   "can deadlock")
    return out


@register("transport.nvshmem-env", "the NVSHMEM environment: NVSHMEM_* set here, beside what DeepEP's Buffer sets "
          "itself in low-latency mode")
def check_nvshmem_env(ctx: Context):
    info = build_info()
    env = transport.nvshmem_env()
    if not info and not env:
        return waived("neither deep_ep nor any NVSHMEM_* variable here: no NVSHMEM user to check")
    import torch
    shared = (torch.cuda.device_count() if torch.cuda.is_available() else 0) < 2
    problems = judge_nvshmem_env(env, shared, bool(_nics(ctx)), ctx.options.ll_num_tokens)
    d = {"set_here": env, "deepep_low_latency_sets": transport.DEEPEP_LL_SETS,
         "deep_ep_nvshmem": info.get("nvshmem") if info else None,
         "cuda_mps": {k: os.environ[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                      if k in os.environ}}
    if problems:
        return failed("; ".join(problems), **d)
    shown = " ".join(f"{k}={v}" for k, v in env.items()) or "none set"
    return passed(f"NVSHMEM_* here: {shown}; DeepEP's low-latency Buffer sets {len(transport.DEEPEP_LL_SETS)} more "
                  "itself (details)", **d)
