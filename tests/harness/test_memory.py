"""Memory in every dispatch record: the backend's buffers outside torch (driver after setup minus before, less
torch's own growth), torch's peaks during the timed phases, the footprint; per rank and the largest."""
import pytest
import torch

from moebench.core.workload import Workload
from moebench.harness import memory
from moebench.harness.launch import run_ranks
from moebench.harness.runner import rank_main
from moebench.harness.spec import RunSpec
from moebench.records import tables
from moebench.records.shapes import Memory

GiB = 2**30


def alltoall(ctx, w=Workload(num_tokens=16, hidden=64, num_experts=4, topk=2, ep=2), device="cpu"):
    spec = RunSpec(w, ("alltoall",), iters=2, views=("api",), device=device)
    return rank_main(ctx, spec, "alltoall", measure=False)


def test_cpu_ranks_report_host_memory_and_why_there_is_no_device_figure():
    outs = run_ranks(alltoall, 2, "cpu", timeout_s=120)
    mem = outs[0].memory
    assert [m["rank"] for m in mem] == [0, 1] and outs[1].memory == mem      # every rank's, on every rank
    assert all(m["none"].startswith("CPU run") and m["host_peak_bytes"] > 10 * 2**20 for m in mem)
    m = Memory.of(mem, shared=False)
    assert m.none.startswith("CPU run") and m.max is None


def fake_reading(monkeypatch, readings: list[dict], peak_alloc: int, peak_reserved: int):
    monkeypatch.setattr(memory.gpumem, "snapshot", lambda index: readings.pop(0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak_alloc)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: peak_reserved)


@pytest.mark.parametrize("nvml, source", [(True, "nvml"), (False, "device")])
def test_buffers_are_the_driver_delta_less_torch_growth(monkeypatch, nvml, source):
    before = {"process_bytes": 1 * GiB if nvml else None, "device_used_bytes": 5 * GiB, "reserved_bytes": 0}
    after = {"process_bytes": 4 * GiB if nvml else None, "device_used_bytes": 8 * GiB, "reserved_bytes": GiB // 2}
    fake_reading(monkeypatch, [before, after], peak_alloc=GiB, peak_reserved=2 * GiB)
    m = memory.Meter(torch.device("cuda", 0))
    m.before(), m.after_setup(), m.timed()
    r = m.result(3)
    assert r == {"rank": 3, "buffers_bytes": 3 * GiB - GiB // 2, "peak_allocated_bytes": GiB,
                 "peak_reserved_bytes": 2 * GiB, "footprint_bytes": 3 * GiB - GiB // 2 + 2 * GiB, "source": source}


def test_the_largest_rank_and_the_shared_gpu_label_reach_the_table():
    ranks = [{"rank": 0, "buffers_bytes": 2 * GiB, "peak_allocated_bytes": GiB, "peak_reserved_bytes": GiB,
              "footprint_bytes": 3 * GiB, "source": "device"},
             {"rank": 1, "buffers_bytes": GiB, "peak_allocated_bytes": 3 * GiB, "peak_reserved_bytes": 4 * GiB,
              "footprint_bytes": 5 * GiB, "source": "device"}]
    m = Memory.of(ranks, shared=True)
    assert m.max == {"buffers_bytes": 2 * GiB, "peak_allocated_bytes": 3 * GiB, "peak_reserved_bytes": 4 * GiB,
                     "footprint_bytes": 5 * GiB}
    assert "functional" in m.note and "other ranks" in m.note
    rec = {"backend": {"name": "hybridep"}, "phase": "dispatch", "timing": {"median_us": 10.0}, "traffic": {},
           "check": {"status": "PASS"}, "memory": m.asdict()}
    head = tables.columns(("api", "graph"), False, False)
    assert tables.table_rows([rec])[0][head.index("mem GiB")] == "5.00"


@pytest.mark.gpu
@pytest.mark.alone
def test_alltoall_on_one_gpu_reports_its_footprint():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    w = Workload(num_tokens=1024, hidden=4096, num_experts=8, topk=2, ep=1)
    outs = run_ranks(alltoall, 1, "cuda", timeout_s=300, args=(w, "cuda"))
    m = outs[0].memory[0]
    x_bytes = w.num_tokens * w.hidden * 2
    assert outs[0].status == "PASS" and m["peak_allocated_bytes"] >= x_bytes * w.topk     # the received rows
    assert m["footprint_bytes"] >= m["peak_reserved_bytes"] >= m["peak_allocated_bytes"]
