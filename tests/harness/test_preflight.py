"""The preflight: before any rank starts, a case that will not fit in memory is refused
(named backend), WAIVED (--backend all) or skipped (sweep) with the estimate; mcore-* on CPU is
WAIVED; a SIGKILLed rank's FAIL says it was likely out of memory."""
import os
import signal
from pathlib import Path

import pytest

from moebench import dispatch
from moebench.core.workload import Workload
from moebench.env.toolkit import installed
from moebench.harness import preflight, runner
from moebench.harness.launch import LaunchError, run_ranks
from moebench.harness.spec import RunSpec

GiB = 2**30
README_2 = ["--ep", "8", "--backend", "alltoall,hybridep", "--num-tokens", "8192", "--hidden", "4096",
            "--num-experts", "128", "--routing", "zipf:1.2,masked:0.1"]
SMALL = Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2)


def spec(w, device="cpu", **kw):
    return RunSpec(w, ("alltoall",), device=device, iters=1, **kw)


def no_launch(*a, **k):
    pytest.fail("a rank launch started")


def test_readme_second_example_is_refused_on_a_24_gib_cpu_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 24 * GiB)
    monkeypatch.setattr(dispatch, "run_case", no_launch)
    rc = dispatch.main([*README_2, "--device", "cpu", "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "alltoall" in err[0] and "estimate" in err[0] and "24.0 GiB available" in err[0], err[0]
    need = float(err[0].split("needs ~")[1].split(" GiB")[0])
    assert need > 24                      # it was OOM-killed there


def test_backend_all_waives_what_does_not_fit_without_launching(monkeypatch):
    small = preflight.estimate("alltoall", False, spec(SMALL)).need
    monkeypatch.setattr(preflight, "available_bytes", lambda device: small - 1)
    monkeypatch.setattr(runner, "run_backend", no_launch)
    recs = runner.run_case(RunSpec(SMALL, ("alltoall",), iters=1), progress=lambda m: None)
    assert {r["check"]["status"] for r in recs} == {"WAIVED"}
    assert "estimate" in recs[0]["check"]["error"] and "GiB" in recs[0]["check"]["error"]
    monkeypatch.setattr(preflight, "available_bytes", lambda device: small)
    assert runner.waiver("alltoall", spec(SMALL)) == ""


def test_sweep_skips_a_case_that_does_not_fit_with_the_estimate(tmp_path, capsys, monkeypatch):
    big = SMALL.replace(num_tokens=4096)
    limit = (preflight.estimate("alltoall", False, spec(SMALL)).need + preflight.estimate("alltoall", False, spec(big)).need) // 2
    monkeypatch.setattr(preflight, "available_bytes", lambda device: limit)
    sw = tmp_path / "s.toml"
    sw.write_text("num_experts = 8\ntopk = 2\nhidden = 64\nnum_tokens = [16, 4096]\n")
    rc = dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--backend", "alltoall", "--iters", "1",
                        "--out", str(tmp_path / "r.jsonl")])
    out, err = capsys.readouterr()
    assert rc == 0, out                                # what fits ran; the case that does not is named
    assert "T=4096" in out and "refused: alltoall on EP 2 needs ~" in out and "estimate" in out
    end = next(line for line in out.splitlines() if line.startswith("# sweep s: ran"))
    assert "ran 1, skipped 0 already in" in end and end.endswith("refused 1")
    assert "REFUSED memory" in out.split("# capability matrix: sweep s")[1]       # the refused cell is recorded
    assert err.startswith("# REFUSED 1 case(s), the first s T=4096")


def test_estimate_grows_with_the_shape_and_counts_every_rank():
    base = preflight.estimate("alltoall", False, spec(SMALL))
    twice = preflight.estimate("alltoall", False, spec(SMALL.replace(num_tokens=32)))
    assert len(base.per_rank) == 2 and base.need == sum(base.per_rank)
    assert twice.need > base.need
    gpu = spec(SMALL, "cuda", ranks_per_gpu=2)
    assert preflight.estimate("deepep", True, gpu).need > preflight.estimate("alltoall", False, gpu).need


def peak_rss_of_a_rank(ctx, run):
    runner.rank_main(ctx, run, "alltoall", False)
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
@pytest.mark.slow
def test_estimate_is_near_the_ranks_measured_peak_memory():
    w = Workload(num_tokens=2048, hidden=2048, num_experts=16, topk=8, ep=2)
    measured = run_ranks(peak_rss_of_a_rank, 2, "cpu", 300.0, args=(spec(w),))
    est = preflight.estimate("alltoall", False, spec(w)).per_rank
    ratios = [e / m for e, m in zip(est, measured)]
    assert all(0.7 <= x <= 1.3 for x in ratios), (ratios, measured)


@pytest.mark.skipif(not installed("megatron.core"), reason="without megatron-core the mcore backends are WAIVED anyway")
def test_mcore_backends_on_cpu_are_waived_before_launching(monkeypatch):
    names = ("mcore-alltoall", "mcore-deepep", "mcore-hybridep")
    monkeypatch.setattr(runner, "run_backend", no_launch)
    recs = runner.run_case(RunSpec(SMALL, names, iters=1), progress=lambda m: None)
    assert {r["backend"]["name"] for r in recs} == set(names)
    assert all(r["check"]["status"] == "WAIVED" for r in recs)
    assert any("need CUDA" in r["check"]["error"] for r in recs if r["backend"]["name"] == "mcore-alltoall")
    assert preflight.needs_cuda("mcore-alltoall", spec(SMALL, knobs={"mcore_cpu_emulation": True})) == ""


def sigkill_rank0(ctx):
    if ctx.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    import torch.distributed as dist
    dist.barrier()


@pytest.mark.slow
def test_a_sigkilled_rank_is_said_to_be_likely_out_of_memory():
    with pytest.raises(LaunchError) as e:
        run_ranks(sigkill_rank0, 2, "cpu", timeout_s=60)
    assert e.value.crash == "SIGKILL" and "likely out of memory" in str(e.value).splitlines()[0]
