"""Link ceilings: a nominal table by GPU SKU / NIC (the measured NCCL all_to_all_single busbw is
harness/timing.measure_alltoall; the NICs' own rates come from sysfs, env/transport.network_ceiling).

Nominal figures are per GPU and per direction (GB/s = 1e9 bytes/s). `frac_of_ceiling` divides
busbw (bytes that crossed links) by the ceiling of the links they crossed: NVLink inside a node,
the per-GPU NIC share across nodes (the RDMA ports' rates where sysfs has them, else the constant).
"""
from __future__ import annotations

# (substring of the device name, NVLink GB/s per direction per GPU); first match wins
NVLINK_NOMINAL = (
    ("GB300", 900.0), ("B300", 900.0), ("GB200", 900.0), ("B200", 900.0),
    ("H800", 200.0), ("H20", 450.0), ("H200", 450.0), ("H100", 450.0),
    ("A800", 200.0), ("A100", 300.0),
)
NIC_NOMINAL_GBPS = 50.0      # 400 Gb/s IB/RoCE per GPU (EFA p5/p6: 3.2 Tb/s per 8 GPUs, the same)
# (substring of the device name, memory per GPU in GiB as marketed, about what torch reports); first match wins.
# A SKU sold in two sizes (A100 40/80 GB) is taken at its larger: plan's --gpu-memory-gib says otherwise
MEMORY_NOMINAL_GIB = (("GB300", 288), ("B300", 288), ("GB200", 186), ("B200", 180), ("H200", 141), ("H20", 96),
                      ("H800", 80), ("H100", 80), ("A800", 80), ("A100", 80))


def nominal_nvlink(gpu_name: str | None) -> float | None:
    for key, gbps in NVLINK_NOMINAL:
        if gpu_name and key in gpu_name.upper():
            return gbps
    return None


def nominal_memory_bytes(gpu_name: str | None) -> float | None:
    return next((gib * 2**30 for key, gib in MEMORY_NOMINAL_GIB if gpu_name and key in gpu_name.upper()), None)


def ceiling_for(gpu_name: str | None, net_bytes: float, override_gbps: float | None = None,
                net: tuple[float, str] | None = None) -> dict:
    """The ceiling for a phase: NVLink when nothing crossed nodes, else the network: `net` (GB/s per GPU,
    where it came from: the RDMA ports' rates), or the nominal NIC constant without it."""
    if override_gbps:
        return {"ceiling_GBps": override_gbps, "ceiling_source": "--ceiling-gbps"}
    if net_bytes > 0:
        if net:
            return {"ceiling_GBps": net[0], "ceiling_source": net[1]}
        return {"ceiling_GBps": NIC_NOMINAL_GBPS, "ceiling_source": "nominal NIC 400 Gb/s (no active RDMA port in sysfs)"}
    nv = nominal_nvlink(gpu_name)
    return {"ceiling_GBps": nv, "ceiling_source": f"nominal NVLink ({gpu_name})" if nv else None}
