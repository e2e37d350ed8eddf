"""Transport preflight: IBGDA readiness, GPUDirect RDMA, GDRCopy, the NVSHMEM environment and the
network ceiling from the RDMA ports, read from fake /proc and /sys trees."""
import json

import pytest

from moebench import check
from moebench.checks.transport import judge_nvshmem_env
from moebench.core import ceilings
from moebench.env import transport


def sysfs(tmp_path, ports=(("mlx5_0", "InfiniBand", "ACTIVE", "400 Gb/sec (4X NDR)", 0),)):
    root = tmp_path / "sys"
    for dev, layer, state, rate, numa in ports:
        p = root / "class" / "infiniband" / dev / "ports" / "1"
        p.mkdir(parents=True)
        (p / "link_layer").write_text(layer)
        (p / "state").write_text(f"4: {state}")
        (p / "rate").write_text(rate)
        (root / "class" / "infiniband" / dev / "device").mkdir()
        (root / "class" / "infiniband" / dev / "device" / "numa_node").write_text(str(numa))
    (root / "module").mkdir(parents=True, exist_ok=True)
    return root


def procfs(tmp_path, stream_mem_ops="1", dwords='"PeerMappingOverride=1;"', modules="", kernel="6.8.0",
           version="NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95"):
    root = tmp_path / "proc"
    (root / "driver" / "nvidia").mkdir(parents=True)
    (root / "driver" / "nvidia" / "params").write_text(
        f"ResmanDebugLevel: 4294967295\nEnableStreamMemOPs: {stream_mem_ops}\nRegistryDwords: {dwords}\n")
    (root / "driver" / "nvidia" / "version").write_text(version)
    (root / "modules").write_text(modules)
    (root / "sys" / "kernel").mkdir(parents=True)
    (root / "sys" / "kernel" / "osrelease").write_text(kernel)
    return root


def run_checks(tmp_path, proc, sys_root, *keys):
    out = tmp_path / "c.json"
    argv = [a for k in keys for a in ("-t", k)] + ["--proc-root", str(proc), "--sysfs-root", str(sys_root),
                                                   "--out", str(out)]
    rc = check.main(argv)
    return rc, {r["key"]: r for r in json.loads(out.read_text())["results"]}


def test_ibgda_reads_the_driver_parameters(tmp_path):
    good = transport.driver_params(procfs(tmp_path / "a"))
    assert transport.ibgda_problems(good) == []
    bad = transport.driver_params(procfs(tmp_path / "b", stream_mem_ops="0", dwords='""'))
    problems = transport.ibgda_problems(bad)
    assert len(problems) == 2 and "NVreg_EnableStreamMemOPs=1" in problems[0] and "PeerMappingOverride" in problems[1]
    assert transport.driver_params(tmp_path / "none") is None


def test_gpudirect_rdma_peermem_or_dmabuf(tmp_path):
    assert transport.gpudirect_rdma(procfs(tmp_path / "a", modules="nvidia_peermem 16384 0 - Live\n"),
                                    tmp_path / "s")[1] == "nvidia_peermem loaded"
    ok, how = transport.gpudirect_rdma(procfs(tmp_path / "b"), tmp_path / "s")
    assert ok and "dma-buf" in how
    ok, how = transport.gpudirect_rdma(procfs(tmp_path / "c", kernel="5.4.0", version="NVRM version: NVIDIA UNIX "
                                              "x86_64 Kernel Module  535"), tmp_path / "s")
    assert not ok and "needs >= 5.12" in how and "proprietary" in how


def test_checks_pass_or_fail_with_nics_and_are_waived_without(tmp_path):
    proc = procfs(tmp_path / "p", stream_mem_ops="0", modules="gdrdrv 24576 0 - Live\n")
    rc, rows = run_checks(tmp_path, proc, sysfs(tmp_path / "s"), "transport")
    assert rc == 1
    assert rows["transport.ibgda"]["status"] == "FAIL" and "EnableStreamMemOPs" in rows["transport.ibgda"]["summary"]
    assert rows["transport.gdr"]["status"] == "PASS" and "dma-buf" in rows["transport.gdr"]["summary"]
    assert rows["transport.gdrcopy"]["status"] == "PASS"
    empty = tmp_path / "empty-sys"
    (empty / "module").mkdir(parents=True)
    rc, rows = run_checks(tmp_path, proc, empty, "transport.ibgda", "transport.gdr", "transport.gdrcopy")
    assert rc == 0 and {r["status"] for r in rows.values()} == {"WAIVED"}
    assert all("no RDMA NICs" in r["summary"] for r in rows.values())
    assert "would not be IBGDA-ready" in rows["transport.ibgda"]["summary"]


def test_nvshmem_environment_contradictions():
    assert judge_nvshmem_env({}, shared_gpu=True, nics=False, ll_tokens=128) == []
    p = judge_nvshmem_env({"NVSHMEM_DISABLE_P2P": "1", "NVSHMEM_QP_DEPTH": "8"}, True, False, 128)
    assert len(p) == 2 and "unreachable" in p[0] and "NVSHMEM_QP_DEPTH=8" in p[1]


@pytest.mark.parametrize("numas, want", [((0, 0, 1, 1), 25.0), ((0, 1, 1, 1), 50.0 / 3), ((None, None), 50.0)])
def test_network_ceiling_is_the_ports_shared_among_their_gpus(tmp_path, numas, want):
    root = sysfs(tmp_path, ports=(("mlx5_0", "InfiniBand", "ACTIVE", "400 Gb/sec", 0),
                                  ("mlx5_1", "Ethernet", "ACTIVE", "400 Gb/sec", 1),
                                  ("mlx5_2", "InfiniBand", "DOWN", "400 Gb/sec", 1)))
    s = transport.nic_summary(transport.scan_nics(root), list(numas))
    assert s["active_ports"] == 2 and s["node_net_GBps"] == 100.0 and s["per_gpu_net_ceiling_GBps"] == want
    got = transport.network_ceiling(root, ngpu=len(numas))
    assert got[0] == 100.0 / len(numas) and "InfiniBand/RoCE" in got[1] and "sysfs" in got[1]   # no NUMA: shared by all


def test_the_record_ceiling_says_where_it_came_from():
    assert ceilings.ceiling_for("NVIDIA H200", 10.0, net=(25.0, "sysfs: 2 ports"))["ceiling_source"] == "sysfs: 2 ports"
    fallback = ceilings.ceiling_for("NVIDIA H200", 10.0)
    assert fallback["ceiling_GBps"] == ceilings.NIC_NOMINAL_GBPS and "nominal" in fallback["ceiling_source"]
    assert transport.network_ceiling("/nonexistent") is None
