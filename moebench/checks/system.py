"""Host checks: software versions (`env`), GPUs (`gpu`), NVLink (`nvlink`) and RDMA NICs (`nic`).

NVML is read in this process (it does not crash on a machine without a driver: it raises), and a
machine without NVML, without NVLink or without RDMA NICs gets WAIVED rows with the reason.
"""
from __future__ import annotations

import os
import platform

from ..core import ceilings
from ..env import buildkind, nccl, topology
from ..env.deepep import build_info
from ..env.toolkit import dist_version
from ..env.topology import nvml
from ..env.transport import gpu_numa, nic_summary, scan_nics
from . import imports
from .registry import Context, failed, passed, register, waived

# NVLink links per GPU by SKU substring (first match wins); PCIe and "NVL" boards: unknown
EXPECTED_LINKS = (("GB300", 18), ("B300", 18), ("GB200", 18), ("B200", 18), ("H800", 8), ("H200", 18),
                  ("H100", 18), ("H20", 18), ("A800", 8), ("A100", 12))
NIC_ROOT = "/sys"


def _nvml_or_reason():
    try:
        return nvml(), ""
    except Exception as e:  # noqa: BLE001 - no library, no driver
        return None, f"NVML unavailable ({type(e).__name__}: {e})"


def _q(fn, *args):
    """One NVML query; None when the device answers Not Supported or anything else fails."""
    try:
        v = fn(*args)
    except Exception:  # noqa: BLE001
        return None
    return v.decode() if isinstance(v, bytes) else v


@register("env", "versions: Python, torch, CUDA, driver, NCCL, triton, NVSHMEM, megatron-core, and the DeepEP build "
          "(version, commit, NVSHMEM, HybridEP kind, libstdc++ linkage)")
def check_env(ctx: Context):
    import torch
    nv, _ = _nvml_or_reason()
    v = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "driver": _q(nv.nvmlSystemGetDriverVersion) if nv else None, **nccl.versions(),
        "triton": dist_version("triton"),
        "nvshmem": dist_version("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12", "nvshmem"),
        "nvshmem4py": dist_version("nvshmem4py-cu13", "nvshmem4py-cu12", "nvshmem4py"),
        "deep_ep": (build_info() or {}).get("summary"), "deep_ep_build": build_info(),
        "deep_ep_files": buildkind.deep_ep_layout(),
        "megatron_core": dist_version("megatron-core", "megatron_core"),
        "transformer_engine": dist_version("transformer_engine", "transformer-engine"),
        "cuda_home": os.environ.get("CUDA_HOME"),
    }
    de = v["deep_ep_files"]
    if de.get("installed"):   # a version only for a package that imports (probed in a child)
        v["deep_ep"] = imports.shown_version(imports.probe(ctx, "deep_ep_probe"), v["deep_ep"])
    if v["megatron_core"]:
        v["megatron_core"] = imports.shown_version(imports.probe(ctx, "megatron_probe"), v["megatron_core"])
    dep = "absent" if not de.get("installed") else f"{v['deep_ep']} [{de['line']}" + (
        f", HybridEP {de['hybridep_build']}" if de.get("hybridep_build") else "") + "]"
    show = ("python", "torch", "cuda", "driver", "nccl", "triton", "nvshmem", "megatron_core")
    return passed(" ".join(f"{k}={v[k] or '-'}" for k in show) + f" deep_ep={dep}", versions=v)


def gpu_rows(nv) -> list[dict]:
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = _q(nv.nvmlDeviceGetMemoryInfo, h)
        out.append({
            "index": i, "name": _q(nv.nvmlDeviceGetName, h),
            "memory_GiB": round(mem.total / 2**30, 1) if mem else None,
            "pci_bus_id": getattr(_q(nv.nvmlDeviceGetPciInfo, h), "busId", None),
            "ecc_uncorrected_volatile": _q(nv.nvmlDeviceGetTotalEccErrors, h,
                                           nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_corrected_volatile": _q(nv.nvmlDeviceGetTotalEccErrors, h,
                                         nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "sm_clock_MHz": _q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "max_sm_clock_MHz": _q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_MHz": _q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "temperature_C": _q(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        })
        if isinstance(out[-1]["pci_bus_id"], bytes):
            out[-1]["pci_bus_id"] = out[-1]["pci_bus_id"].decode()
    return out


def judge_gpus(gpus: list[dict]) -> list[str]:
    """Problems that fail the `gpu` check: no GPU, mixed SKUs, uncorrected ECC errors."""
    problems = []
    if not gpus:
        problems.append("NVML sees no GPU")
    names = sorted({g["name"] for g in gpus})
    if len(names) > 1:
        problems.append(f"mixed GPU SKUs: {', '.join(map(str, names))}")
    for g in gpus:
        if g.get("ecc_uncorrected_volatile"):
            problems.append(f"GPU {g['index']}: {g['ecc_uncorrected_volatile']} uncorrected ECC errors")
    return problems


@register("gpu", "GPU count, SKU, memory, ECC error counters and clocks (NVML)")
def check_gpu(ctx: Context):
    nv, why = _nvml_or_reason()
    if nv is None:
        return waived(why)
    gpus = gpu_rows(nv)
    problems = judge_gpus(gpus)
    if problems:
        return failed("; ".join(problems), gpus=gpus)
    g = gpus[0]
    clocks = f"SM clock {g['sm_clock_MHz']}/{g['max_sm_clock_MHz']} MHz" if g["sm_clock_MHz"] else "clocks n/a"
    ecc = sum(x.get("ecc_uncorrected_volatile") or 0 for x in gpus)
    return passed(f"{len(gpus)}x {g['name']}, {g['memory_GiB']} GiB, uncorrected ECC {ecc}, {clocks}", gpus=gpus)


def expected_links(name: str | None) -> int | None:
    up = (name or "").upper()
    if "PCIE" in up or " NVL" in up:
        return None
    return next((n for key, n in EXPECTED_LINKS if key in up), None)


def nvlink_domain(inv=None) -> tuple[int | None, str]:
    """(GPUs in this node's NVLink domain, how it was found); None when it cannot be told."""
    inv = inv or topology.inventory()
    if inv.source != "nvml":
        return None, f"no NVML ({inv.error or 'no GPU'})"
    links = [g.nvlinks_up for g in inv.gpus]
    if not links:
        return None, "NVML sees no GPU"
    if all(n is None for n in links):
        return 1, "NVML reports NVLink Not Supported: every GPU is its own domain"
    return sum(1 for n in links if n), "GPUs of this node with NVLinks up (NVML)"


def judge_links(gpus) -> tuple[list[str], list[dict]]:
    problems, rows = [], []
    for g in gpus:
        want = expected_links(g.name)
        rows.append({"index": g.index, "name": g.name, "links_up": g.nvlinks_up, "expected": want})
        if want is not None and g.nvlinks_up is not None and g.nvlinks_up < want:
            problems.append(f"GPU {g.index} ({g.name}): {g.nvlinks_up} of {want} NVLinks up")
    return problems, rows


@register("nvlink", "active NVLinks per GPU against the SKU's count; NVLink domain size")
def check_nvlink(ctx: Context):
    inv = topology.inventory()
    if inv.source != "nvml":
        return waived(f"NVML unavailable: {inv.error or 'no GPU'}")
    if inv.gpus and all(g.nvlinks_up is None for g in inv.gpus):
        return waived(f"NVML reports NVLink state Not Supported on all {len(inv.gpus)} GPU(s) "
                      "(no NVLink here, e.g. a 1-GPU VM or PCIe boards)")
    problems, rows = judge_links(inv.gpus)
    domain, how = nvlink_domain(inv)
    if problems:
        return failed("; ".join(problems), gpus=rows, domain_size=domain)
    ups = sorted({r["links_up"] for r in rows})
    return passed(f"{len(rows)} GPU(s), NVLinks up per GPU: {ups}; NVLink domain {domain} ({how})",
                  gpus=rows, domain_size=domain, nominal_GBps=ceilings.nominal_nvlink(rows[0]["name"]))


@register("nic", "RDMA NICs (InfiniBand, RoCE, EFA): link state and rate, GPU affinity, per-GPU network ceiling")
def check_nic(ctx: Context):
    root = getattr(ctx.options, "sysfs_root", None) or NIC_ROOT
    nics = scan_nics(root)
    if not nics:
        return waived(f"no RDMA NICs under {root}/class/infiniband: single-node only, inter-node rows "
                      "have no network ceiling here")
    nv, _ = _nvml_or_reason()
    bus = [g["pci_bus_id"] for g in gpu_rows(nv)] if nv else []
    s = {**nic_summary(nics, gpu_numa(root, bus)), "nominal_per_gpu_GBps": ceilings.NIC_NOMINAL_GBPS}
    down = [f"{n['device']}/{n['port']} ({n['state']})" for n in nics if not n["active"]]
    if not s["active_ports"]:
        return failed(f"no RDMA port is ACTIVE: {', '.join(down)}", nics=nics, **s)
    kinds = sorted({n["kind"] for n in nics if n["active"]})
    msg = (f"{s['active_ports']} active {'/'.join(kinds)} port(s), {s['node_net_GBps']:.0f} GB/s per node, "
           f"{s['per_gpu_net_ceiling_GBps']:.1f} GB/s per GPU")
    return passed(msg + (f"; down: {', '.join(down)}" if down else ""), nics=nics, **s)
