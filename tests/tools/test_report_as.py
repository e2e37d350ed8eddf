"""report --as PEER: published tables reproduced in form (a record of the same shape, and the figure the peer's formula
gives for it, printed in the peer's column), a record that predates a rule, an unknown peer.

Each record's bytes come from the real byte rules on moebench's routing of that shape; each test recounts them by
hand (its own loop over the routing, or the peer's constant per copy) and sets the time the published row states."""
import functools
import json

import pytest

from moebench import report
from moebench.core import traffic
from moebench.core.workload import Workload, make_routing
from moebench.records.schema import SCHEMA


@functools.lru_cache(maxsize=None)
def _traffic(w: Workload):
    return traffic.traffic_of([make_routing(w, r)[0] for r in range(w.ep)], w)


def rec(w, phase, api_us, name, views=None, dedup=True, upstream=True):
    t = _traffic(w)
    tr = traffic.phase_bytes(t, w, phase, dedup)
    if upstream:
        tr["upstream"] = traffic.upstream_bytes(t, w, phase)
    timing = {"median_us": api_us, "p10_us": api_us, "p90_us": api_us, "min_us": api_us, "iters": 20}
    return {"schema": SCHEMA, "workload": w.asdict(), "device": "cuda", "env": {"gpu": "NVIDIA H200"},
            "backend": {"name": name, "knobs": {}, "dedup": dedup}, "phase": phase, "timing": timing,
            "traffic": tr, "check": {"status": "PASS"}, "functional": False, "views": views or {}}


def view(us, **extra):
    return {"us": us, "max_over_ranks_us": us, "aggregation": "test", **extra}


def run_as(tmp_path, capsys, recs, peer, *more):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert report.main([str(path), "--as", peer, *more]) == 0
    return capsys.readouterr().out


def pairs_per_rank(w):
    """Hand count: unique (token, destination rank) pairs of every rank, self included, / ranks."""
    n = 0
    for r in range(w.ep):
        idx = make_routing(w, r)[0]
        for row in idx.tolist():
            n += len({e // w.local_experts for e in row if e >= 0})
    return n / w.ep


def test_aws_results_ep16_rows(tmp_path, capsys):
    """awslabs/awsome-distributed-ai RESULTS.md (B200, EP16 = 2 nodes x 8, 128 tokens/rank, H 7168, 256 experts, top-8):
    UCCL BF16 0.5920 ms -> 49.59 GB/s/rank; UCCL FP8 0.5213 ms -> 42.68 GB/s/rank. The formula: 128 x 8 selections
    x (dispatch tensor + 2H) / latency; input throughput 128 x 16 / latency."""
    out_rows = []
    for dtype, ms, per_selection in (("bf16", 0.5920, 2 * 7168 + 2 * 7168), ("fp8", 0.5213, 7168 + 56 * 4 + 2 * 7168)):
        w = Workload(num_tokens=128, hidden=7168, num_experts=256, topk=8, ep=16, gpus_per_node=8, dtype=dtype)
        half = ms * 1e3 / 2
        out = run_as(tmp_path, capsys, [rec(w, "dispatch", half, "deepep-ll", dedup=False),
                                        rec(w, "combine", half, "deepep-ll", dedup=False)], "aws")
        logical = 128 * 8 * per_selection / (ms * 1e-3) / 1e9
        assert f"{logical:.2f} GB/s/rank" in out and f"{ms:.4f} ms" in out
        out_rows.append(out)
        assert f"{128 * 16 / (ms * 1e-3):,.2f} tokens/s" in out
        # scale-out: the selections of each rank whose expert sits on the other node, counted by hand
        off = sum(((make_routing(w, r)[0] // 16 // 8 != r // 8) & (make_routing(w, r)[0] >= 0)).sum().item()
                  for r in range(16)) / 16
        assert f"{off * per_selection / (ms * 1e-3) / 1e9:.2f} GB/s/rank" in out
    assert "49.59 GB/s/rank" in out_rows[0] and "42.68 GB/s/rank" in out_rows[1]


@pytest.mark.parametrize("T,dtype,dispatch_gbps,combine_gbps", [
    (8192, "fp8", 726, 740),       # deepseek-ai/DeepEP@dd758ca README: SM100, EP 8, NVLink, 64 SMs
    (4096, "bf16", 289, 342),      # nebius/ml-cookbook@0953130 deepep/README.md "Performance": H200, v2
])
def test_deepep_v2_published_ep8_rows(tmp_path, capsys, T, dtype, dispatch_gbps, combine_gbps):
    """DeepEP V2's SU figures at EP8, H 7168, 256 experts, top-8 (DeepEP's README: 8K tokens, FP8 dispatch, BF16
    combine; Nebius's H200 table: 4096 tokens, BF16): received (token, rank) rows x (payload + 8 B id + 4 B weight
    per top-k) / the kernel time; the combine x (2H + 4 B weight per top-k)."""
    w = Workload(num_tokens=T, hidden=7168, num_experts=256, topk=8, ep=8, dtype=dtype)
    pairs = pairs_per_rank(w)
    payload = 7168 + 7168 // 128 * 4 if dtype == "fp8" else 2 * 7168
    d_bytes, c_bytes = pairs * (payload + 8 * 12), pairs * (2 * 7168 + 8 * 4)
    t_d, t_c = d_bytes / (dispatch_gbps + 0.2) / 1e3, c_bytes / (combine_gbps + 0.2) / 1e3   # the kernel us implied
    recs = [rec(w, "dispatch", 2 * t_d, "deepep-v2", {"kernel": view(t_d)}),
            rec(w, "combine", 2 * t_c, "deepep-v2", {"kernel": view(t_c)})]
    out = run_as(tmp_path, capsys, recs, "deepep-v2")
    d, c = (ln.split() for ln in out.splitlines() if ln.startswith(str(T)))   # T backend phase t SU SO bytes
    assert d[2:] == ["dispatch", f"{t_d:.3f}", str(dispatch_gbps), "-", f"{d_bytes:.0f}"]
    assert c[2:] == ["combine", f"{t_c:.3f}", str(combine_gbps), "-", f"{c_bytes:.0f}"]


def test_collectivex_chained_pair_period_and_logical_gbps(tmp_path, capsys):
    """SemiAnalysisAI/InferenceX experimental/CollectiveX docs/methodology.md ("Chained Pair Period"): DeepEP V2 normal,
    EP8, T=128, BF16: a 105.4 us free-running period (125.4 us drained). pair_period is the chained view's per-pair
    median over ranks; dispatch GB/s/GPU = routed (token, rank) copies x 2H / EP / the dispatch p50."""
    w = Workload(num_tokens=128, hidden=7168, num_experts=256, topk=8, ep=8)
    chain = view(110.0, median_over_ranks_us=105.4, spread_us=2.0)
    recs = [rec(w, "dispatch", 70.0, "deepep-v2", {"chained": chain}),
            rec(w, "combine", 55.4, "deepep-v2", {"chained": chain})]
    out = run_as(tmp_path, capsys, recs, "collectivex")
    row = next(ln for ln in out.splitlines() if ln.startswith("128")).split()
    per_gpu = pairs_per_rank(w) * 2 * 7168 / (70.0 * 1e-6) / 1e9
    # T backend wire dispatch combine pair_period dispatch-GB/s combine-GB/s
    assert row[2:7] == ["dedup", "70.0", "55.4", "105.4", f"{per_gpu:.1f}"]


def test_deepep_v1_h200_dispatch_in_the_cached_view(tmp_path, capsys):
    """nebius/ml-cookbook@0953130 deepep/README.md "Performance" (DeepEP V1, 8 x H200, 4096 tokens, H 7168, 256 experts, top-8, BF16):
    336 GB/s dispatch: test_intranode's recv_x.numel() x 2 / its cached-call time."""
    w = Workload(num_tokens=4096, hidden=7168, num_experts=256, topk=8, ep=8)
    nvl = pairs_per_rank(w) * 2 * 7168
    t = nvl / 336.0e9 * 1e6
    out = run_as(tmp_path, capsys, [rec(w, "dispatch", 1.2 * t, "deepep", {"cached": view(t)})], "deepep")
    row = next(ln for ln in out.splitlines() if ln.startswith("4096")).split()   # T backend phase from t NVL
    assert row[3:6] == ["cached", f"{t:.2f}", "336.00"]


def test_nccl_tests_busbw_is_algbw_times_7_over_8(tmp_path, capsys):
    w = Workload(num_tokens=512, hidden=1024, num_experts=64, topk=4, ep=8)
    out = run_as(tmp_path, capsys, [rec(w, "dispatch", 100.0, "alltoall", dedup=False)], "nccl-tests")
    size = pairs_per_rank(w) * 2 * 1024
    row = next(ln for ln in out.splitlines() if ln.startswith("512")).split()
    assert row[3] == f"{size:.0f}" and row[5] == f"{size / 100e-6 / 1e9:.2f}"
    assert row[6] == f"{size * 7 / 8 / 100e-6 / 1e9:.2f}"


def test_a_record_without_the_rule_gets_a_dash_and_the_reason_once(tmp_path, capsys):
    w = Workload(num_tokens=64, hidden=1024, num_experts=64, topk=4, ep=8)
    old = [rec(w, p, 50.0, "alltoall", dedup=False, upstream=False) for p in ("dispatch", "combine")]
    out = run_as(tmp_path, capsys, old, "nccl-tests")
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("64")]
    assert len(rows) == 2 and all(r[3] == "-" and r[5] == "-" for r in rows)
    reasons = [ln for ln in out.splitlines() if "predates" in ln]        # once per rule key, not once per row
    assert len(reasons) == 2 and "nccl_tests_alltoall_bytes:" in reasons[0] and "_bus_bytes:" in reasons[1]
    got = json.loads(run_as(tmp_path, capsys, old, "nccl-tests", "--json"))
    assert got[0]["cells"]["algbw (GB/s)"] is None and "predates" in got[0]["missing"]["algbw (GB/s)"]


def test_unknown_peer_names_the_known_ones(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec(Workload(num_tokens=8, hidden=256, num_experts=8, topk=2, ep=2), "dispatch", 5.0,
                                   "alltoall")) + "\n")
    assert report.main([str(path), "--as", "nccl"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nccl'" in err
    for name in ("collectivex", "aws", "nccl-tests", "deepep", "deepep-v2", "ep_bench", "hybridep"):
        assert f"'{name}'" in err
    assert report.main([str(path), "--as", "aws", "--best-knobs"]) == 2


def test_a_new_record_gives_every_peer_every_figure_but_deepep_v2_scale_out(tmp_path, capsys):
    """Two nodes, every view timed: no cell of any peer is missing for want of a rule (the only `-` by design:
    DeepEP V2's scale-out figure, which moebench does not compute)."""
    from moebench.records import peers
    w = Workload(num_tokens=16, hidden=256, num_experts=16, topk=4, ep=16, gpus_per_node=8)
    views = {v: view(10.0, median_over_ranks_us=9.0) for v in ("cached", "kernel", "chained")}
    recs = [rec(w, p, 20.0, "deepep", dict(views)) for p in ("dispatch", "combine")]
    for name, peer in peers.PEERS.items():
        for row in peers.rows(peer, recs):
            assert set(row["missing"]) <= {"GB/s (SO)"}, (name, row["missing"])
            assert all(v is not None for k, v in row["cells"].items() if k != "GB/s (SO)")
