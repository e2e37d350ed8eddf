"""moebench.plan: its model against hand-computed cases; bad numbers are one line naming the flag, exit 2
(never replaced by a default); CPU and shared-GPU results are not used as measurements."""
from math import comb
import json
import resource
import subprocess
import sys
import time

import pytest

from conftest import ROOT, fake_env
from moebench import plan
from moebench.core.workload import Workload, WorkloadError


def run(capsys, *argv):
    assert plan.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_ep16_on_8gpu_nodes_half_from_other_node(capsys):
    p = run(capsys, "--gpus", "16", "--gpus-per-node", "8", "--ep", "16", "--num-tokens", "2048")
    lay, f = p["layout"], p["pairs"]["dispatch"]["fraction"]
    assert lay["leaves_nvlink_domain"] and lay["ep_nodes"] == 2 and lay["ep_ranks_per_node"] == 8
    # uniform: every source sends the same expected pairs to a rank; 8 of 16 sources are on the other node
    assert f["net"] == pytest.approx(0.5, abs=0.01)
    assert f["local"] == pytest.approx(1 / 16, abs=0.005) and f["nvlink"] == pytest.approx(7 / 16, abs=0.01)
    assert p["pairs"]["combine"]["fraction"]["net"] == pytest.approx(0.5, abs=0.01)
    assert any("leave the NVLink domain" in a for a in p["advice"])
    assert any("With EP 8" in a for a in p["advice"])


def test_ep8_on_8gpu_nodes_has_no_network_pairs(capsys):
    p = run(capsys, "--gpus", "16", "--ep", "8", "--num-tokens", "1024")
    d = p["pairs"]["dispatch"]
    assert not p["layout"]["leaves_nvlink_domain"] and p["layout"]["expert_dp"] == 2
    assert d["mean"]["net"] == 0 and d["max"]["net"] == 0 and p["bytes"]["dispatch"]["net_bytes"] == 0
    assert d["fraction"]["local"] == pytest.approx(1 / 8, abs=0.005)
    assert "Keep it there" in p["advice"][0]


def test_tp_times_ep_leaves_the_domain(capsys):
    p = run(capsys, "--gpus", "16", "--ep", "8", "--tp", "2", "--num-tokens", "1024")
    lay = p["layout"]
    assert lay["etp"] == 2 and lay["ep_span_ranks"] == 16 and lay["leaves_nvlink_domain"]
    assert lay["ep_ranks_per_node"] == 4
    assert p["pairs"]["dispatch"]["fraction"]["net"] == pytest.approx(0.5, abs=0.01)   # 4 of 8 EP ranks remote
    p = run(capsys, "--gpus", "16", "--ep", "8", "--tp", "2", "--etp", "1", "--num-tokens", "1024")
    assert not p["layout"]["leaves_nvlink_domain"] and p["pairs"]["dispatch"]["mean"]["net"] == 0


def expected_pairs_per_token(ranks, experts_per_rank, pool, k):
    """Distinct ranks hit when k distinct experts are drawn from `pool` experts over `ranks` ranks."""
    return ranks * (1 - comb(pool - experts_per_rank, k) / comb(pool, k))


def test_pair_counts_match_hypergeometric_and_group_limits():
    T = 2048
    w = Workload(num_tokens=T, hidden=256, num_experts=64, topk=4, ep=16, gpus_per_node=8)
    c = plan.pair_counts(w)
    # every source sends T tokens; each reaches E[distinct ranks] ranks; 16 sources, 16 destinations
    assert c["dispatch"]["mean"]["total"] / T == pytest.approx(expected_pairs_per_token(16, 4, 64, 4), rel=0.02)
    # group:2:1 -> all 4 experts inside one 32-expert group = one node's 8 ranks
    g = plan.pair_counts(w.replace(routing="group:2:1"))
    assert g["dispatch"]["mean"]["total"] / T == pytest.approx(expected_pairs_per_token(8, 4, 32, 4), rel=0.02)
    assert g["dispatch"]["mean"]["total"] < c["dispatch"]["mean"]["total"]
    # each token reaches exactly one node: node-deduplicated network rows = T/2 per source, shared by 8 ranks
    assert g["dispatch"]["mean"]["net_node_dedup"] == pytest.approx(16 * T * 0.5 / 16, rel=0.05)


def test_group_limited_to_one_of_eight_nodes(capsys):
    p = run(capsys, "--gpus", "64", "--ep", "64", "--routing", "group:8:1", "--num-tokens", "1024")
    # the chosen group (= node) is the source's own node with probability 1/8
    assert p["pairs"]["dispatch"]["fraction"]["net"] == pytest.approx(7 / 8, abs=0.01)


def test_predicted_times_follow_link_speeds(tmp_path, capsys):
    base = ["--gpus", "8", "--ep", "8", "--num-tokens", "1024", "--hidden", "1024"]
    p = run(capsys, *base)
    d = p["pairs"]["dispatch"]
    lower = d["mean"]["nvlink"] * 2 * 1024 / 450e9 * 1e6
    upper = d["max"]["nvlink"] * 2 * 1024 / 450e9 * 1e6
    assert lower <= p["predicted_us"]["nominal"]["dispatch"] <= upper * 1.0001
    rec = {"workload": {"num_tokens": 1024, "hidden": 1024, "topk": 8, "dtype": "bf16"}, "backend": {"name": "deepep"},
           "phase": "dispatch", "timing": {"median_us": 1.0}, "check": {"status": "PASS"},
           "traffic": {"bus_bytes": 1.0, "net_bytes": 0.0, "busbw_GBps": 300.0}}
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    p2 = run(capsys, *base, "--results", str(f))
    assert p2["predicted_us"]["measured:deepep"]["dispatch"] == pytest.approx(
        p2["predicted_us"]["nominal"]["dispatch"] * 450 / 300)
    p3 = run(capsys, *base, "--nvlink-gbps", "900")
    assert p3["predicted_us"]["nominal"]["dispatch"] == pytest.approx(p["predicted_us"]["nominal"]["dispatch"] / 2)


def test_memory_is_measured_where_a_record_of_this_shape_has_it_else_estimated(tmp_path, capsys):
    base = ["--gpus", "8", "--ep", "8", "--num-tokens", "1024", "--hidden", "1024", "--num-experts", "64"]
    est = {m["backend"]: m for m in run(capsys, *base)["memory_per_gpu"]}
    assert set(est) == {"alltoall", "deepep", "hybridep"} and all(m["source"].startswith("estimated") for m in est.values())
    assert est["alltoall"]["bytes"] >= 1024 * 1024 * 2 * 8          # at least the K copies of its tokens it receives
    w = {"num_tokens": 1024, "hidden": 1024, "topk": 8, "dtype": "bf16", "num_experts": 64, "ep": 8}
    rec = {"workload": w, "backend": {"name": "hybridep"}, "phase": "dispatch", "timing": {"median_us": 1.0},
           "check": {"status": "PASS"}, "traffic": {"bus_bytes": 1.0, "net_bytes": 0.0, "busbw_GBps": 300.0},
           "memory": {"per_rank": [], "max": {"footprint_bytes": 3 * 2**30}}}
    other = {**rec, "workload": {**w, "num_tokens": 2048}, "memory": {"per_rank": [], "max": {"footprint_bytes": 1}}}
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(other) + "\n" + json.dumps(rec) + "\n")
    mem = {m["backend"]: m for m in run(capsys, *base, "--results", str(f))["memory_per_gpu"]}
    assert mem["hybridep"] == {"backend": "hybridep", "bytes": 3 * 2**30, "source": f"measured ({f}:2)"}
    assert mem["deepep"]["source"].startswith("estimated")         # no record of this shape: said so


def test_large_ep_samples_tokens_and_stays_fast(capsys):
    t0 = time.time()
    p = run(capsys, "--gpus", "512", "--ep", "512", "--num-experts", "512", "--num-tokens", "4096")
    assert time.time() - t0 < 20
    assert p["sampled_tokens"] < 4096
    assert p["pairs"]["dispatch"]["fraction"]["net"] == pytest.approx(1 - 8 / 512, abs=0.005)
    assert p["pairs"]["dispatch"]["mean"]["total"] == pytest.approx(
        4096 * expected_pairs_per_token(512, 1, 512, 8), rel=0.03)


def test_bad_layouts_exit_2(capsys):
    assert plan.main(["--gpus", "16", "--ep", "3"]) == 2            # 256 experts over 3 ranks
    assert plan.main(["--gpus", "12", "--ep", "12", "--num-experts", "48"]) == 2   # 12 ranks straddle 8-GPU nodes
    assert plan.main(["--gpus", "8", "--ep", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("moebench.plan: error:") == 3 and "Traceback" not in err
    with pytest.raises(WorkloadError):
        plan.layout(16, 8, 4, tp=3)


def test_text_output(capsys):
    assert plan.main(["--gpus", "16", "--ep", "16", "--num-tokens", "512"]) == 0
    out = capsys.readouterr().out
    assert "leaves the NVLink domain: YES" in out and "predicted (nominal)" in out and "advice:" in out


BASE = ["--ep", "8", "--num-tokens", "256", "--hidden", "256"]


@pytest.mark.parametrize("argv, flag", [
    (["--gpus", "0", *BASE], "--gpus"), ([*BASE, "--net-gbps", "0"], "--net-gbps"),
    ([*BASE, "--net-gbps", "-1"], "--net-gbps"), ([*BASE, "--nvlink-gbps", "-1"], "--nvlink-gbps"),
    ([*BASE, "--nvlink-gbps", "0"], "--nvlink-gbps"), ([*BASE, "--nvlink-gbps", "nan"], "--nvlink-gbps"),
    (["--ep", "0"], "--ep"), (["--gpus", "16", "--ep", "0"], "--ep"),
])
def test_bad_plan_numbers_name_their_flag(capsys, argv, flag):
    assert plan.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"moebench.plan: error: {flag} "), err


def measured(device, functional, busbw=300.0):
    return {"workload": {"num_tokens": 256, "hidden": 256, "topk": 8, "dtype": "bf16"}, "backend": {"name": "deepep"},
            "device": device, "functional": functional, "phase": "dispatch", "timing": {"median_us": 1.0},
            "check": {"status": "PASS"}, "traffic": {"bus_bytes": 1.0, "net_bytes": 0.0, "busbw_GBps": busbw}}


def test_cpu_results_are_not_measurements(tmp_path, capsys):
    cpu = tmp_path / "cpu.jsonl"
    cpu.write_text(json.dumps(measured("cpu", True, 0.05)) + "\n")
    assert plan.main([*BASE, "--results", str(cpu)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("moebench.plan: error: --results: every record is functional only"), err
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps(measured("cpu", True, 0.05)) + "\n" + json.dumps(measured("cuda", False)) + "\n")
    assert plan.main([*BASE, "--results", str(both), "--json"]) == 0
    out, err = capsys.readouterr()
    p = json.loads(out)
    nominal = p["predicted_us"]["nominal"]["dispatch"]
    assert p["predicted_us"]["measured:deepep"]["dispatch"] == pytest.approx(nominal * 450 / 300)   # the GPU row only
    assert "left out 1 record" in err


# ---- sizes no cluster plan has: one line and exit 2 in seconds, or advice that says the shape does not fit ----
def plan_cli(*argv, timeout=60) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m moebench.plan` as a user runs it, held to 4 GiB of address space (a regression fails, not the host)."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "moebench.plan", *argv], capture_output=True, text=True, timeout=timeout,
                       env=fake_env(), cwd=ROOT, preexec_fn=cap)
    return p, time.time() - t0


def refused_fast(argv, *words):
    p, took = plan_cli(*argv)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-2000:])
    assert err[0].startswith("moebench.plan: error: ") and all(w in err[0] for w in words), err[0]
    assert took < 15, took


@pytest.mark.parametrize("argv, words", [
    (["--ep", "100000", "--num-experts", "100000"], ("--ep must be at most 65536",)),
    (["--ep", "2048", "--num-experts", "2048", "--gpus", "2048"], ("EP 2048 x 2048 experts", "1048576")),
    (["--ep", "16", "--num-experts", "65536", "--topk", "65536"], ("--topk must be at most 256",)),
], ids=["ep-100000", "ep-x-experts", "topk"])
def test_ep_times_experts_past_any_layout_is_refused_not_simulated(argv, words):
    """Every EP rank's routing is drawn over every expert: EP 100000 x 100000 experts grew to 24 GB and was killed."""
    refused_fast(argv, *words)


def test_a_hidden_size_past_int64_is_one_line():
    refused_fast(["--ep", "16", "--num-experts", "256", "--hidden", "9" * 20], "--hidden must be at most 65536")


@pytest.mark.parametrize("argv, words", [
    (["--ep", "8", "--num-tokens", str(10**12)], ("--num-tokens must be at most 16777216",)),
    (["--ep", "8", "--num-tokens", "9" * 20], ("--num-tokens must be at most",)),
    (["--ep", "8", "--pp", "9" * 20], ("--pp must be at most 65536",)),
    (["--ep", "8", "--tp", "65536", "--pp", "65536"], ("34359738368 GPUs", "at most 1048576")),
    (["--ep", "8", "--gpus", str(10**20)], ("--gpus", "at most 1048576")),
    (["--ep", "8", "--gpus-per-node", "9" * 20], ("--gpus-per-node must be at most 65536",)),
    (["--ep", "8", "--nvlink-gbps", "1e-300"], ("--nvlink-gbps must be",)),
    (["--ep", "8", "--sample-budget", "9" * 20], ("--sample-budget must be at most",)),
], ids=["tokens-1e12", "tokens-1e20", "pp", "gpus-implied", "gpus", "gpus-per-node", "nvlink-gbps", "sample-budget"])
def test_shapes_no_cluster_has_are_refused(argv, words):
    refused_fast(argv, *words)


def test_a_shape_no_gpu_holds_is_advised_as_not_fitting():
    """10^6 tokens per rank at H 7168 needs ~560 GiB per GPU: the advice was 'Keep it there'."""
    p, _ = plan_cli("--ep", "8", "--num-tokens", "1000000", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["gpu"] == {"name": "H200", "memory_bytes": 141 * 2**30}
    assert all(m["bytes"] > 141 * 2**30 for m in out["memory_per_gpu"])
    assert len(out["advice"]) == 1 and out["advice"][0].startswith("does not fit:"), out["advice"]
    assert "141 GiB" in out["advice"][0] and "--num-tokens" in out["advice"][0]


def test_memory_fit_follows_the_gpu(capsys):
    base = ["--ep", "8", "--num-tokens", "256", "--hidden", "1024"]
    assert not any("does not fit" in a for a in run(capsys, *base)["advice"])        # a few MiB on an H200
    tight = run(capsys, *base, "--gpu-memory-gib", "0.001")
    assert tight["advice"][0].startswith("does not fit:") and len(tight["advice"]) == 1
    unknown = run(capsys, *base, "--gpu", "XPU9", "--nvlink-gbps", "100")
    assert "Keep it there" in unknown["advice"][0] and "--gpu-memory-gib" in unknown["advice"][-1]
    assert unknown["gpu"]["memory_bytes"] is None
