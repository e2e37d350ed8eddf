"""CPU tier: Megatron flags for every backend and both megatron-core families; the winner rules."""
import json

import pytest

from moebench import megatron
from moebench.megatron import ab
from moebench.megatron import flags as F
from moebench.records import schema, writer
from moebench.records.megatron import FLAGS_SCHEMA

W = {"num_tokens": 4096, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16",
     "routing": "uniform", "seed": 0, "gpus_per_node": 8}


def rec(name, phase, median, p10=None, p90=None, status="PASS", knobs=None, workload=None, error=None, env=None):
    timing = None if status != "PASS" else {"median_us": median, "p10_us": p10 if p10 is not None else median - 1,
                                            "p90_us": p90 if p90 is not None else median + 1}
    return {"schema": schema.SCHEMA, "workload": workload or W, "device": "cuda", "phase": phase,
            "backend": {"name": name, "knobs": knobs or {}}, "timing": timing,
            "check": {"status": status, "error": error}, "env": {"env": env or {}}}


def pair(name, d, c, spread=1.0, **kw):
    return [rec(name, "dispatch", d, d - spread, d + spread, **kw), rec(name, "combine", c, c - spread, c + spread, **kw)]


# ---------------------------------------------------------------- flags
@pytest.mark.parametrize("version,new", [("0.16.1", False), ("0.17.0", False), ("0.19.2", True), ("0.20.0rc1", True)])
@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_flex_flags_by_version(backend, version, new):
    f = F.megatron_flags(backend, version, num_sms=24)
    lm = f.megatron_lm
    assert lm[:4] == ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", backend]
    sms_flag = "--moe-flex-dispatcher-num-sms" if new else f"--moe-{backend}-num-sms"
    assert lm[lm.index(sms_flag) + 1] == "24"
    other = f"--moe-{backend}-num-sms" if new else "--moe-flex-dispatcher-num-sms"
    assert other not in lm
    key = "moe_flex_dispatcher_num_sms" if new else f"moe_{backend}_num_sms"
    assert f.megatron_bridge == ["model.moe_token_dispatcher_type=flex",
                                 f"model.moe_flex_dispatcher_backend={backend}", f"model.{key}=24"]


@pytest.mark.parametrize("version", ["0.16.1", "0.19.2"])
def test_alltoall_flags_ignore_sms(version):
    f = F.megatron_flags("alltoall", version, num_sms=24)
    assert f.megatron_lm == ["--moe-token-dispatcher-type", "alltoall"]
    assert f.megatron_bridge == ["model.moe_token_dispatcher_type=alltoall"]
    assert f.env == {} and any("SM count" in n for n in f.notes)


def test_mcore_names_map_to_megatron_values():
    assert F.megatron_flags("mcore-hybridep", "0.19.2").megatron_lm[3] == "hybridep"
    assert F.megatron_flags("mcore-alltoall", "0.16.1").megatron_lm[1] == "alltoall"


def test_hybridep_env_and_overlap():
    f = F.megatron_flags("hybridep", "0.19.2", 16, overlap=True, ep=8, ranks_per_nvlink_domain=4)
    assert f.env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "4"
    assert f.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert "--overlap-moe-expert-parallel-comm" in f.megatron_lm and "--delay-wgrad-compute" in f.megatron_lm
    assert "comm_overlap.overlap_moe_expert_parallel_comm=true" in f.megatron_bridge
    assert not any(b.startswith("model.overlap") for b in f.megatron_bridge)
    f1 = F.megatron_flags("alltoall", "0.19.2", overlap=True, ep=1)       # Megatron rejects overlap at EP 1
    assert "--overlap-moe-expert-parallel-comm" not in f1.megatron_lm and any("EP > 1" in n for n in f1.notes)
    assert "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN" not in F.megatron_flags("deepep", "0.19.2").env


@pytest.mark.parametrize("bad", [("foo", "0.19.2"), ("deepep-ll", "0.19.2"), ("deepep", "latest")])
def test_flags_bad_input(bad):
    with pytest.raises(F.FlagsError):
        F.megatron_flags(*bad)


# ---------------------------------------------------------------- winner rules
def test_clear_win_replaces_alltoall_and_takes_recorded_sms():
    recs = pair("alltoall", 500, 600) + pair("deepep", 300, 350, knobs={"num_sms": 24}) + pair("hybridep", 450, 500)
    [d] = ab.decisions_from_results(recs, "0.19.2")
    assert d["winner"] == "deepep" and d["family"] == "raw"
    assert "--moe-flex-dispatcher-num-sms" in d["flags"]["megatron_lm"]
    assert d["flags"]["megatron_lm"][-1] == "24"
    c = {x["name"]: x for x in d["candidates"]}
    assert c["deepep"]["gain_us"] == pytest.approx(450) and c["hybridep"]["wins"]   # both win; deepep larger


def test_the_decision_names_each_footprint_and_its_difference_to_the_control():
    def with_memory(recs, gib):
        return [{**r, "memory": {"per_rank": [], "max": {"footprint_bytes": int(gib * 2**30)}}} for r in recs]
    recs = with_memory(pair("alltoall", 500, 600), 5.0) + with_memory(pair("hybridep", 300, 350), 3.5) + \
        pair("deepep", 450, 500)
    [d] = ab.decisions_from_results(recs, "0.19.2")
    c = {x["name"]: x for x in d["candidates"]}
    assert c["hybridep"]["footprint_delta_bytes"] == -int(1.5 * 2**30) and c["deepep"]["footprint_delta_bytes"] is None
    text = ab.format_decision(d)
    assert "control alltoall: 1100.0 us (p10 1098.0, p90 1102.0); memory 5.00 GiB" in text
    assert "; memory 3.50 GiB (-1.50 vs control)" in text
    assert all(len(line) <= 160 for line in text.splitlines() if line.startswith("#"))


def test_knob_sweep_best_setting_feeds_the_flags():
    sms = lambda n, d, c: [dict(r, sweep={"name": "t", "case": n, "knobs": {"num_sms": n, "env:NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API": 128}})
                           for r in pair("hybridep", d, c, knobs={"num_sms": n})]
    recs = pair("alltoall", 500, 600) + sms(8, 600, 700) + sms(32, 300, 320) + sms(48, 350, 330)
    [d] = ab.decisions_from_results(recs, "0.19.2")
    assert d["winner"] == "hybridep"
    assert d["flags"]["megatron_lm"][-2:] == ["--moe-flex-dispatcher-num-sms", "32"]
    assert d["flags"]["env"]["NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API"] == "128"
    c = {x["name"]: x for x in d["candidates"]}
    assert c["hybridep"]["gain_us"] == pytest.approx(1100 - 620)


def test_tie_within_noise_keeps_alltoall():
    recs = pair("alltoall", 500, 600, spread=30) + pair("deepep", 480, 590, spread=30)
    [d] = ab.decisions_from_results(recs, "0.19.2")
    assert d["winner"] == "alltoall"
    assert d["flags"]["megatron_lm"] == ["--moe-token-dispatcher-type", "alltoall"]
    assert "within the measured noise" in d["reason"]
    # the same gain with tight measurements is a win
    recs = pair("alltoall", 500, 600, spread=2) + pair("deepep", 480, 590, spread=2)
    assert ab.decisions_from_results(recs, "0.19.2")[0]["winner"] == "deepep"


def test_min_gain_threshold():
    recs = pair("alltoall", 500, 500, spread=1) + pair("deepep", 490, 490, spread=1)
    assert ab.decide(recs)["winner"] == "deepep"
    d = ab.decide(recs, min_gain=0.05)
    assert d["winner"] == "alltoall" and "below the required" in d["reason"]


def test_missing_and_failed_candidates():
    recs = pair("alltoall", 500, 600) + pair("hybridep", 0, 0, status="FAIL", error="boom")
    d = ab.decide(recs)
    assert d["winner"] == "alltoall"
    assert "no matched A/B" in d["reason"] and "hybridep FAIL" in d["reason"]
    recs = pair("alltoall", 500, 600) + pair("deepep", 400, 400) + pair("hybridep", 0, 0, status="WAIVED")
    d = ab.decide(recs)
    c = {x["name"]: x for x in d["candidates"]}
    assert d["winner"] == "deepep" and not c["hybridep"]["wins"] and "WAIVED" in c["hybridep"]["why"]
    recs = pair("alltoall", 500, 600) + pair("hybridep", 400, 400)
    c = {x["name"]: x for x in ab.decide(recs)["candidates"]}
    assert c["deepep"]["status"] == "MISSING"


def test_no_control_keeps_alltoall():
    d = ab.decide(pair("deepep", 100, 100))
    assert d["winner"] == "alltoall" and "no matched A/B" in d["reason"]


def test_slower_candidate_loses():
    d = ab.decide(pair("alltoall", 300, 300) + pair("deepep", 400, 400))
    assert d["winner"] == "alltoall" and "slower" in d["candidates"][0]["why"]


def test_mcore_family_preferred_and_not_mixed():
    # raw deepep wins big against raw alltoall, but the Megatron path (mcore-*) shows a tie: mcore decides
    recs = (pair("alltoall", 500, 500) + pair("deepep", 100, 100) + pair("mcore-alltoall", 600, 600, spread=50)
            + pair("mcore-deepep", 590, 590, spread=50))
    d = ab.decide(recs)
    assert d["family"] == "mcore" and d["winner"] == "alltoall" and d["control"]["name"] == "mcore-alltoall"
    # an mcore candidate is never compared with the raw control
    recs = pair("alltoall", 500, 500) + pair("mcore-deepep", 100, 100)
    assert ab.decide(recs)["winner"] == "alltoall"


def test_incomplete_phases_are_not_eligible():
    recs = pair("alltoall", 500, 500) + [rec("deepep", "dispatch", 10)]
    d = ab.decide(recs)
    assert d["winner"] == "alltoall" and "deepep INCOMPLETE" in d["reason"]


def test_workloads_are_decided_separately():
    w2 = {**W, "routing": "zipf:1.2"}
    recs = (pair("alltoall", 500, 500) + pair("deepep", 100, 100)
            + pair("alltoall", 500, 500, workload=w2) + pair("deepep", 700, 700, workload=w2))
    ds = ab.decisions_from_results(recs, "0.16.1")
    assert sorted((d["workload"]["routing"], d["winner"]) for d in ds) == [("uniform", "deepep"), ("zipf:1.2", "alltoall")]


def test_hybridep_env_from_workload_or_record():
    recs = pair("alltoall", 500, 500) + pair("hybridep", 100, 100)
    w4 = {**W, "ep": 16, "gpus_per_node": 4}
    assert ab.decisions_from_results(recs, "0.19.2")[0]["flags"]["env"]["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "8"
    recs4 = pair("alltoall", 500, 500, workload=w4) + pair("hybridep", 100, 100, workload=w4)
    assert ab.decisions_from_results(recs4, "0.19.2")[0]["flags"]["env"]["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "4"
    recs_env = pair("alltoall", 500, 500) + pair("hybridep", 100, 100, env={"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "2"})
    assert ab.decisions_from_results(recs_env, "0.19.2")[0]["flags"]["env"]["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "2"


# ---------------------------------------------------------------- CLI
def test_cli_results_json(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    writer.write_jsonl(path, pair("alltoall", 500, 600) + pair("hybridep", 200, 250, knobs={"num_sms": 16}))
    assert megatron.main(["flags", "--results", str(path), "--megatron-core-version", "0.16.1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == FLAGS_SCHEMA
    [d] = out["decisions"]
    assert d["winner"] == "hybridep"
    assert d["flags"]["megatron_lm_cmdline"] == ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend "
                                                 "hybridep --moe-hybridep-num-sms 16")


def test_cli_backend_text(capsys):
    assert megatron.main(["flags", "--backend", "deepep", "--num-sms", "20", "--megatron-core-version", "0.19.2"]) == 0
    out = capsys.readouterr().out
    assert "megatron-lm:     --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep " \
           "--moe-flex-dispatcher-num-sms 20" in out
    assert "model.moe_flex_dispatcher_num_sms=20" in out


@pytest.mark.parametrize("argv", [
    ["flags", "--backend", "nope", "--megatron-core-version", "0.19.2"],
    ["flags", "--backend", "deepep", "--megatron-core-version", "x.y"],
    ["flags", "--backend", "deepep", "--num-sms", "0", "--megatron-core-version", "0.19.2"],
    ["flags", "--results", "/nonexistent/r.jsonl", "--megatron-core-version", "0.19.2"],
])
def test_cli_bad_input_exit_2(argv, capsys):
    assert megatron.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("moebench.megatron flags: error:") and len(err.strip().splitlines()) == 1


def test_cli_empty_results_exit_2(tmp_path, capsys):
    p = tmp_path / "empty.jsonl"
    p.write_text(json.dumps({"something": "else"}) + "\n")
    assert megatron.main(["flags", "--results", str(p), "--megatron-core-version", "0.19.2"]) == 2
    assert "no moebench.dispatch records" in capsys.readouterr().err


@pytest.mark.parametrize("zero_copy", [1, 0, None])
def test_ncclep_winner_flags_say_how_it_was_timed(zero_copy):
    """An ncclep winner timed with Megatron's static shape + zero copy gets those flags; one timed without (or a
    record older than the knob) does not."""
    knobs = {"mode": "ht", **({"zero_copy": zero_copy} if zero_copy is not None else {})}
    [d] = ab.decisions_from_results(pair("alltoall", 500, 600) + pair("ncclep", 300, 350, knobs=knobs), "0.19.2")
    lm = d["flags"]["megatron_lm"]
    assert d["winner"] == "ncclep" and ("--moe-ncclep-zero-copy" in lm) == bool(zero_copy)
    assert ("--moe-ncclep-static-shape" in lm) == bool(zero_copy)
