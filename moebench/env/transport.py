"""The transports DeepEP's low-latency and inter-node paths need, read from /proc and /sys (no GPU,
no driver call; `root` arguments let tests point at fake trees):

- RDMA ports (InfiniBand, RoCE, EFA) under /sys/class/infiniband: kind, state, rate, NUMA node; the
  per-GPU network ceiling is the active ports' rate shared among the GPUs that use them.
- IBGDA readiness: the NVIDIA driver's `EnableStreamMemOPs: 1` and `PeerMappingOverride=1` in its
  RegistryDwords (/proc/driver/nvidia/params), what NVSHMEM's GPU-initiated RDMA needs.
- GPUDirect RDMA: the nvidia_peermem module loaded, or dma-buf (kernel >= 5.12 with NVIDIA's open
  kernel module); GDRCopy: the gdrdrv module.
- The NVSHMEM environment: every NVSHMEM_* variable set, beside the ones DeepEP's Buffer sets itself
  in low-latency mode (deep_ep/buffer.py on branch hybrid-ep).
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

# what deep_ep.Buffer(low_latency_mode=True) writes into os.environ before NVSHMEM starts (never restored)
DEEPEP_LL_SETS = {
    "NVSHMEM_DISABLE_P2P": "0 (1 when NVLink is not allowed for low-latency mode)",
    "NVSHMEM_IB_ENABLE_IBGDA": "1", "NVSHMEM_IBGDA_NUM_RC_PER_PE": "num_qps_per_rank",
    "NVSHMEM_QP_DEPTH": "its value, else 1024", "NVSHMEM_MAX_TEAMS": "7", "NVSHMEM_DISABLE_NVLS": "1",
    "NVSHMEM_CUMEM_GRANULARITY": str(2**29), "NVSHMEM_DISABLE_MNNVL": "1 (unless allow_mnnvl)",
}


def read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def rate_gbit(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0."""
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def scan_nics(root: str | Path = "/sys") -> list[dict]:
    """One row per RDMA port under <root>/class/infiniband (InfiniBand, RoCE, EFA)."""
    base = Path(root) / "class" / "infiniband"
    rows = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        numa = read(dev / "device" / "numa_node")
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            layer = read(port / "link_layer") or ""
            kind = "EFA" if dev.name.startswith("efa") else {"InfiniBand": "InfiniBand", "Ethernet": "RoCE"}.get(layer, layer or "?")
            state = read(port / "state") or ""
            rows.append({"device": dev.name, "port": port.name, "kind": kind, "state": state,
                         "active": "ACTIVE" in state.upper(), "rate_Gbps": rate_gbit(read(port / "rate")),
                         "numa_node": int(numa) if numa and numa.lstrip("-").isdigit() else None})
    return rows


def gpu_numa(root: str | Path, bus_ids: list[str]) -> list[int | None]:
    """NUMA node of each GPU from its PCI bus id ('00000000:18:00.0' -> /sys/bus/pci/devices/0000:18:00.0)."""
    out = []
    for b in bus_ids:
        v = read(Path(root) / "bus" / "pci" / "devices" / b[-12:].lower() / "numa_node") if b else None
        out.append(int(v) if v and v.lstrip("-").isdigit() else None)
    return out


def nic_summary(nics: list[dict], gpu_numas: list[int | None]) -> dict:
    """The per-GPU network ceiling and the GPU -> NIC affinity. A GPU's share: the active ports on its
    NUMA node divided among that node's GPUs; without NUMA information, all active ports among all GPUs.
    The ceiling is the smallest share (the slowest GPU bounds an all-to-all)."""
    active = [n for n in nics if n["active"] and n["rate_Gbps"]]
    total_GBps = sum(n["rate_Gbps"] for n in active) / 8.0
    ngpu = max(1, len(gpu_numas))
    affinity = {i: [f"{n['device']}/{n['port']}" for n in active if n["numa_node"] is not None and n["numa_node"] == g]
                for i, g in enumerate(gpu_numas)}
    shares = []
    for g in gpu_numas:
        local = [n for n in active if g is not None and n["numa_node"] == g]
        if not local:
            shares = []
            break
        shares.append(sum(n["rate_Gbps"] for n in local) / 8.0 / gpu_numas.count(g))
    per_gpu = min(shares) if shares else total_GBps / ngpu
    return {"active_ports": len(active), "node_net_GBps": total_GBps, "per_gpu_net_ceiling_GBps": per_gpu,
            "shared_by": "NUMA node" if shares else "all GPUs", "gpu_nic_affinity": affinity}


def network_ceiling(root: str | Path = "/sys", bus_ids: list[str] | None = None,
                    ngpu: int = 1) -> tuple[float, str] | None:
    """(per-GPU network GB/s, where the figure came from) from the RDMA ports' rates, or None when no
    active port is found (the nominal constant stays the fallback)."""
    nics = scan_nics(root)
    numas = gpu_numa(root, bus_ids) if bus_ids else [None] * max(1, ngpu)
    s = nic_summary(nics, numas)
    if not s["active_ports"]:
        return None
    kinds = "/".join(sorted({n["kind"] for n in nics if n["active"]}))
    return (s["per_gpu_net_ceiling_GBps"],
            f"sysfs: {s['active_ports']} active {kinds} port(s), {s['node_net_GBps'] * 8:g} Gb/s per node shared by "
            f"{s['shared_by']} ({len(numas)} GPU(s))")


@functools.lru_cache(maxsize=1)
def node_net_ceiling() -> tuple[float, str] | None:
    """This node's per-GPU network ceiling from its RDMA ports (sysfs), shared by the GPUs on their NUMA node."""
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    bus = [f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0" for p in props
           if hasattr(p, "pci_bus_id")]
    return network_ceiling(bus_ids=bus or None, ngpu=max(1, n))


def driver_params(root: str | Path = "/proc") -> dict | None:
    """/proc/driver/nvidia/params as {name: value}; None without an NVIDIA driver."""
    text = read(Path(root) / "driver" / "nvidia" / "params")
    if text is None:
        return None
    return {k.strip(): v.strip().strip('"') for k, _, v in (line.partition(":") for line in text.splitlines()) if k}


def ibgda_problems(params: dict) -> list[str]:
    """What the driver's settings lack for IBGDA (NVSHMEM's GPU-initiated RDMA, DeepEP's LL kernels)."""
    out = []
    if params.get("EnableStreamMemOPs") != "1":
        out.append(f"EnableStreamMemOPs is {params.get('EnableStreamMemOPs', 'unset')} (IBGDA needs "
                   "NVreg_EnableStreamMemOPs=1)")
    if not re.search(r"PeerMappingOverride\s*=\s*1", params.get("RegistryDwords", "")):
        out.append(f"RegistryDwords {params.get('RegistryDwords', '')!r} lacks PeerMappingOverride=1 (IBGDA needs "
                   "NVreg_RegistryDwords=\"PeerMappingOverride=1;\")")
    return out


def loaded_modules(root: str | Path = "/proc", sys_root: str | Path = "/sys") -> set[str]:
    """Kernel modules loaded (/proc/modules, and /sys/module for built-in ones)."""
    text = read(Path(root) / "modules") or ""
    mods = {line.split()[0] for line in text.splitlines() if line.strip()}
    base = Path(sys_root) / "module"
    for name in ("nvidia_peermem", "gdrdrv", "nv_peer_mem"):
        if (base / name).is_dir():
            mods.add(name)
    return mods


def kernel_version(root: str | Path = "/proc") -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", read(Path(root) / "sys" / "kernel" / "osrelease") or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def gpudirect_rdma(root: str | Path = "/proc", sys_root: str | Path = "/sys") -> tuple[bool, str]:
    """(available, how): nvidia_peermem (or the older nv_peer_mem) loaded, or dma-buf."""
    mods = loaded_modules(root, sys_root)
    peer = sorted(mods & {"nvidia_peermem", "nv_peer_mem"})
    if peer:
        return True, f"{peer[0]} loaded"
    kv = kernel_version(root)
    open_module = "Open Kernel Module" in (read(Path(root) / "driver" / "nvidia" / "version") or "")
    if kv and kv >= (5, 12) and open_module:
        return True, f"dma-buf (kernel {kv[0]}.{kv[1]}, NVIDIA open kernel module)"
    return False, (f"no nvidia_peermem module and no dma-buf (kernel {'.'.join(map(str, kv)) if kv else '?'}"
                   f"{', needs >= 5.12' if kv and kv < (5, 12) else ''}; NVIDIA "
                   f"{'open' if open_module else 'proprietary or unknown'} kernel module, dma-buf needs the open one)")


def nvshmem_env(environ=os.environ) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NVSHMEM_")}
