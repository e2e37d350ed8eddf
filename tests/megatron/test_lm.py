"""Megatron-LM validation: the log reader on real Megatron-LM lines (committed from the H200 run), the verdict on
synthetic arms, the argument and flag rules, the launch recipe, and the whole path against a stand-in
pretrain_gpt.py (tests/fakes/megatron_lm) that runs Megatron-Core's real token dispatchers on CPU/gloo and
prints Megatron-format lines."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKES, FIXTURES, ROOT
from moebench import megatron
from moebench.harness import launch
from moebench.megatron import ab
from moebench.megatron.lm import arm as lm_arm, args as lm_args, log as lm_log, plan as lm_plan, verdict as lm_verdict
from moebench.megatron.quick import loop
from moebench.megatron import flags as F

FIX = FIXTURES
STANDIN = FAKES / "megatron_lm"
HAVE_MCORE = __import__("importlib.util").util.find_spec("megatron.core") is not None
needs_mcore = pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core is not installed")


# ---------------------------------------------------------------- the log reader, on real lines
def test_reads_megatron_lm_log_from_the_h200():
    log = lm_log.parse((FIX / "megatron_lm_h200_ep1.log").read_text())
    its = {i.iteration: i for i in log.iterations}
    assert sorted(its) == [1, 2, 3, *range(21, 31)]
    assert its[1].elapsed_ms == 8961.8 and its[1].tflops_per_gpu == 5.2 and its[1].lm_loss == pytest.approx(10.79241)
    assert its[30].train_iters == 30 and its[30].global_batch_size == 8 and its[30].grad_norm == 3.832
    assert log.nan == 0 and log.skipped == 0
    assert [m.after_iterations for m in log.memory] == [1, 2, 30]
    last = log.memory[-1]
    assert last.rank == 0 and last.max_reserved_MB == 20906.0 and last.max_allocated_MB == 19510.57
    assert last.device_used_MB is not None and last.device_used_MB > last.max_reserved_MB
    assert log.args["moe_token_dispatcher_type"] == "alltoall" and log.args["transformer_impl"] == "local"
    assert log.args["moe_flex_dispatcher_backend"] == "deepep"      # Megatron's default, unused with alltoall
    st = lm_arm.steady(log.iterations, 10)
    assert st["first_iteration"] == 21 and st["mean_ms"] == pytest.approx(sum(i.elapsed_ms for i in log.iterations[-10:]) / 10)


def test_reads_interleaved_rank_output_from_the_shared_gpu_run():
    """Two ranks share one stdout: rank 0's text can sit in front of the last rank's iteration line."""
    log = lm_log.parse((FIX / "megatron_lm_h200_shared_hybridep.log").read_text())
    assert [i.iteration for i in log.iterations] == [1, 2, 28, 29, 30]
    assert log.iterations[1].elapsed_ms == 17031.2 and log.iterations[0].lm_loss == pytest.approx(10.57817)
    assert [m.max_reserved_MB for m in log.memory] == [2896.0, 3106.0, 3108.0]


def test_a_nan_iteration_has_no_loss_and_fails_the_arm():
    line = (FIX / "megatron_lm_h200_ep1.log").read_text().splitlines()
    line = next(ln for ln in line if "iteration       22/" in ln)
    bad = line.replace("lm loss: ", "x: ").replace("number of nan iterations:   0", "number of nan iterations:   1")
    it = lm_log.parse_iteration(bad)
    assert it.lm_loss is None and it.nan == 1
    log = lm_log.parse([line.replace("22/", "21/"), bad])
    problems = lm_arm.iteration_problems(log, 2)
    assert problems == ["1 NaN iteration(s)"]
    assert lm_arm.iteration_problems(lm_log.parse([line]), 30)[0] == "Megatron logged 1 of 30 iterations"


def test_error_tail_names_the_rank_that_failed_not_the_launcher():
    lines = ["Traceback (most recent call last):", '  File "/x/pretrain_gpt.py", line 9, in main',
             "RuntimeError: stand-in: deepep crashed at iteration 3",
             "E1204 failed (exitcode: 1) local_rank: 0", "Traceback (most recent call last):",
             '  File "/usr/lib/python3/site-packages/torch/distributed/run.py", line 1032, in <module>',
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
    tail = lm_log.error_tail(lines)
    assert tail[-1] == "RuntimeError: stand-in: deepep crashed at iteration 3" and len(tail) == 3
    assert lm_log.error_tail(["ok", "NCCL WARN something", "fine"]) == ["NCCL WARN something"]


# ---------------------------------------------------------------- the verdict
ENV = {"gpu": "NVIDIA H200", "gpu_count": 8, "nccl": "2.28.9", "driver": "580", "git_sha": "abc"}


def arm(disp, ms, repeat=0, status="PASS", loss=None, env=None, functional=False, argv=(), n=10, mem=None):
    its = [{"iteration": i, "elapsed_ms": ms, "lm_loss": (loss or 10.0) - 0.1 * i} for i in range(1, n + 1)]
    samples = [ms * (1 + 0.002 * ((i * 7) % 5 - 2)) for i in range(n)]
    return {"schema": "moebench.megatron.arm/1", "validation": "v1", "dispatcher": disp, "repeat": repeat,
            "order": repeat, "role": "control" if disp == "alltoall" else "candidate", "status": status, "errors": [],
            "iterations": its, "steady": {"samples_ms": samples, "mean_ms": ms}, "env": env or ENV, "functional": functional,
            "megatron_argv": list(argv), "window": n, "memory": {"ranks": mem or []}}


def judge(arms, **kw):
    return {v.candidate: v for v in lm_verdict.judge(arms, **kw)}


def test_verdict_switch_keep_and_inconclusive():
    v = judge([arm("alltoall", 185, r) for r in (0, 1)] + [arm("hybridep", 168, r) for r in (0, 1)])["hybridep"]
    assert v.verdict == "SWITCH" and v.ratio == pytest.approx(168 / 185, rel=1e-3) and v.ci95[0] < v.ratio < v.ci95[1]
    v = judge([arm("alltoall", 170, r) for r in (0, 1)] + [arm("deepep", 185, r) for r in (0, 1)])["deepep"]
    assert v.verdict == "KEEP" and "not more than" in v.reason
    noisy = [arm("alltoall", 100, 0), arm("alltoall", 104, 1), arm("deepep", 98, 0), arm("deepep", 105, 1)]
    assert judge(noisy)["deepep"].verdict == "INCONCLUSIVE"
    # a 9% gain does not clear a 10% requirement anywhere in its interval
    v = judge([arm("alltoall", 185, r) for r in (0, 1)] + [arm("hybridep", 168, r) for r in (0, 1)], min_gain=0.1)
    assert v["hybridep"].verdict == "KEEP"


def test_verdict_fails_on_loss_mismatch_whatever_the_speed():
    arms = [arm("alltoall", 185), arm("hybridep", 100, loss=10.5)]
    v = judge(arms)["hybridep"]
    assert v.verdict == "FAIL" and "loss curve differs" in v.reason and not v.loss["match"]
    assert judge(arms, loss_rtol=0.1)["hybridep"].verdict == "SWITCH"


def test_verdict_fails_a_failed_arm_and_refuses_other_machines():
    v = judge([arm("alltoall", 185), arm("deepep", 150), arm("deepep", 0, 1, status="FAIL")])["deepep"]
    assert v.verdict == "FAIL" and "deepep repeat 1 FAILED" in v.reason
    other = {**ENV, "gpu": "NVIDIA H100 80GB HBM3"}
    v = judge([arm("alltoall", 185), arm("deepep", 150, env=other)])["deepep"]
    assert v.verdict == "REFUSED" and "GPU model NVIDIA H200 vs NVIDIA H100" in v.reason
    v = judge([arm("alltoall", 185), arm("deepep", 150, env={**ENV, "git_sha": "def"})])["deepep"]
    assert v.verdict == "SWITCH" and v.notes[0].startswith("moebench abc vs def")


def test_verdict_labels_functional_and_forced_balance_and_memory_deltas():
    mem = lambda b: [{"rank": 0, "max_reserved_bytes": b, "process_bytes": b + 100, "device_used_bytes": 2 * b}]  # noqa: E731
    arms = [arm("alltoall", 185, functional=True, mem=mem(1000)),
            arm("hybridep", 168, functional=True, argv=["--moe-router-force-load-balancing"], mem=mem(900))]
    v = judge(arms)["hybridep"]
    assert any(x.startswith("functional") for x in v.labels) and any(x.startswith("benchmark-only") for x in v.labels)
    assert v.functional and v.memory[0]["delta_max_reserved_bytes"] == -100 and v.memory[0]["delta_device_used_bytes"] == -200


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -5.0, "12", 1e-300, 1e300])
def test_verdict_refuses_impossible_samples_with_file_and_line(bad):
    a = arm("alltoall", 185)
    a["steady"]["samples_ms"][3] = bad
    with pytest.raises(lm_verdict.VerdictInputError, match=r"runs.jsonl:7: steady\.samples_ms\[3\] is "):
        lm_verdict.judge([{**a, "_file": "runs.jsonl", "_line": 7}, arm("deepep", 150)])


# ---------------------------------------------------------------- flags and argument rules
def test_flags_refuse_flex_at_ep1_and_check_the_nvlink_domain():
    with pytest.raises(F.FlagsError, match="TP x EP > 1"):
        F.megatron_flags("deepep", "0.19.2", ep=1)
    assert F.megatron_flags("deepep", "0.19.2", ep=1, tp=2).megatron_lm[-1] == "deepep"
    with pytest.raises(F.FlagsError, match="does not divide EP x TP = 12"):
        F.megatron_flags("hybridep", "0.19.2", ep=12, ranks_per_nvlink_domain=8)
    with pytest.raises(F.FlagsError, match="exceeds the NVLink domain found: 4"):
        F.megatron_flags("hybridep", "0.19.2", ep=16, ranks_per_nvlink_domain=8, domain_found=4)


def test_flags_print_the_bridge_performance_harness_form():
    f = F.megatron_flags("hybridep", "0.19.2", overlap=True, ep=8, ranks_per_nvlink_domain=8)
    i = f.bridge_perf.index("--moe_flex_dispatcher_backend")
    assert f.bridge_perf[i:i + 4] == ["--moe_flex_dispatcher_backend", "hybridep", "--moe_a2a_overlap", "true"]
    assert "-E NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8" in f.bridge_perf
    assert "model.moe_shared_expert_overlap=false" in f.megatron_bridge
    a = F.megatron_flags("alltoall", "0.19.2")
    assert a.bridge_perf[-4:] == ["--moe_flex_dispatcher_backend", "None", "--moe_a2a_overlap", "false"]
    assert "bridge-perf:" in ab.format_decision({"winner": "alltoall", "reason": "x", "flags": a.asdict()})


def _rec(name, phase, us, w, env=ENV):
    return {"workload": w, "backend": {"name": name, "knobs": {}}, "phase": phase, "device": "cuda",
            "check": {"status": "PASS"}, "env": env,
            "timing": {"median_us": us, "p10_us": us * 0.99, "p90_us": us * 1.01}}


def _ab(w, cand="hybridep", env=ENV):
    return [_rec("alltoall", p, 500, w) for p in ("dispatch", "combine")] + \
        [_rec(cand, p, 300, w, env) for p in ("dispatch", "combine")]


def test_ab_rules_ineligible_candidates_and_labels():
    w = {"num_tokens": 4096, "hidden": 7168, "num_experts": 256, "topk": 8, "ep": 8, "dtype": "bf16",
         "routing": "uniform", "gpus_per_node": 8}
    assert ab.decide(_ab(w), version="0.19.2")["winner"] == "hybridep"
    d = ab.decide(_ab({**w, "dtype": "fp8"}), version="0.19.2")
    assert d["winner"] == "alltoall" and "cannot dispatch FP8" in d["reason"]
    assert ab.decide(_ab({**w, "dtype": "fp8"}, "deepep"), version="0.19.2")["winner"] == "deepep"
    d = ab.decide(_ab({**w, "ep": 1}), version="0.19.2")
    assert d["winner"] == "alltoall" and "TP x EP > 1" in d["reason"]
    d = ab.decide(_ab(w, env={**ENV, "driver": "570"}), version="0.19.2")
    assert d["winner"] == "alltoall" and "driver 580 vs 570" in d["reason"]
    d = ab.decide(_ab({**w, "routing": "balanced"}), version="0.19.2")
    assert d["winner"] == "hybridep" and d["labels"][0].startswith("benchmark-only")


def test_user_arguments_may_not_carry_dispatcher_flags():
    with pytest.raises(lm_args.LmError, match="may not set --moe-token-dispatcher-type"):
        lm_args.user_args("--num-layers 2 --moe-token-dispatcher-type=flex")
    assert lm_args.user_args("--num-layers 2 --seq-length 512") == ["--num-layers", "2", "--seq-length", "512"]
    only_ctl, only_cand = lm_args.dispatcher_diff(["p.py", "--a", "1", "--moe-token-dispatcher-type", "alltoall"],
                                                  ["p.py", "--a", "1", "--moe-token-dispatcher-type", "flex",
                                                   "--moe-flex-dispatcher-backend", "deepep"])
    assert only_ctl == ["--moe-token-dispatcher-type alltoall"]
    assert only_cand == ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]


def _launch(ep=2, rpg=1):
    return lm_arm.Launch("cuda", 2, ep, ranks_per_gpu=rpg)


@pytest.mark.parametrize("argv,disp,match", [
    (["--num-experts", "16", "--moe-grouped-gemm"], "deepep", "needs --disable-bias-linear"),
    (["--num-experts", "16", "--fp8-format", "hybrid"], "hybridep", "cannot dispatch FP8"),
    (["--num-experts", "15"], "deepep", "not divisible by EP 2"),
    (["--num-layers", "2"], "deepep", "no --num-experts"),
])
def test_plan_rules_refuse_before_any_launch(argv, disp, match):
    with pytest.raises(lm_args.LmError, match=match):
        lm_plan.check_rules(argv, ["alltoall", disp], _launch(), "0.19.1", None, (2, "test"))


def test_plan_rules_check_hybridep_domain_and_flex_at_ep1():
    with pytest.raises(lm_args.LmError, match="exceeds the NVLink domain found here: 2"):
        lm_plan.check_rules(["--num-experts", "16"], ["hybridep"], _launch(), "0.19.1", 4, (2, "test"))
    with pytest.raises(lm_args.LmError, match="TP x EP > 1"):
        lm_plan.check_rules(["--num-experts", "16"], ["deepep"], lm_arm.Launch("cuda", 1, 1), "0.19.1", None, (1, "t"))


def test_checkout_version_rules(tmp_path):
    with pytest.raises(lm_args.LmError, match="no pretrain_gpt.py"):
        lm_args.inspect_checkout(str(tmp_path), "0.19.2")
    (tmp_path / "pretrain_gpt.py").write_text("")
    core = tmp_path / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 19\nPATCH = 1\n")
    ck = lm_args.inspect_checkout(str(tmp_path), "0.19.2", "f8837c0")
    assert ck.version == "0.19.1" and ck.core_used == "0.19.1" and ck.commit == "f8837c0"
    assert any("is not used" in n for n in ck.notes)
    (core / "package_info.py").rename(tmp_path / "package_info.py")
    core.rmdir()
    assert lm_args.inspect_checkout(str(tmp_path), "0.19.2").core_used == "0.19.2"


def test_launch_recipe_shapes(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
              "SLURM_NTASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    assert lm_plan.launcher_shape() is None
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_STEP_ID", "0")            # a task srun started
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8(x2)")
    assert lm_plan.launcher_shape() == (16, 8, "srun")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert lm_plan.launcher_shape() == (16, 8, "torchrun")
    la = lm_plan.make_launch("cpu", None, 1, joined=(16, 8, "torchrun"))
    assert (la.nnodes, la.nproc_per_node, la.world, la.ep, la.launcher) == (2, 8, 16, 16, "torchrun")
    with pytest.raises(lm_args.LmError, match="do not split into nodes of 6"):
        lm_plan.make_launch("cpu", None, 1, joined=(16, 6, "srun"))


def test_validate_refuses_under_a_launcher_and_arm_outside_one(monkeypatch, capsys):
    monkeypatch.setenv("MEGATRON_LM", str(STANDIN))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert megatron.main(["validate", "--dispatcher", "deepep", "--device", "cpu", "--ep", "2"]) == 2
    assert "`megatron arm` once per arm" in capsys.readouterr().err
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k)
    assert megatron.main(["arm", "--dispatcher", "deepep", "--device", "cpu", "--ep", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one rank of a torchrun or srun job" in err[0]


def test_quick_loop_under_a_launcher_runs_every_arm_on_every_rank(monkeypatch, tmp_path):
    """Rank 1 of a torchrun job takes part in the control and the candidate (the old code left after the
    control, and rank 0 waited on a new process group)."""
    calls = []
    monkeypatch.setattr(loop, "environment", lambda args, d, e: ("cuda", 2))
    monkeypatch.setattr(loop, "run_training", lambda spec, d, *a, **k: calls.append(d))
    monkeypatch.setattr(launch, "is_lead", lambda: False)
    args = megatron.parser().parse_args(["validate", "--dispatcher", "hybridep", "--out", str(tmp_path / "o.jsonl")])
    assert loop.cmd_quick(args, [], "hybridep") == 0
    assert calls == ["alltoall", "hybridep"] and not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------- the whole path, against the stand-in
def run_cli(args, tmp_path, **env):
    e = {**os.environ, "FAKE_DEEP_EP_CTOR": "sim", "PYTHONPATH": f"{ROOT / 'tests' / 'fakes'}:{ROOT}", **env}
    return subprocess.run([sys.executable, "-m", "moebench.megatron", *args], cwd=tmp_path, env=e,
                          capture_output=True, text=True, timeout=600)


STANDIN_ARGS = ["--megatron-lm", str(STANDIN), "--device", "cpu", "--ep", "2", "--iters", "5", "--window", "3"]


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@needs_mcore
@pytest.mark.slow
def test_validate_against_the_stand_in_gives_a_verdict(tmp_path):
    out = tmp_path / "v.jsonl"
    p = run_cli(["validate", "--dispatcher", "deepep", *STANDIN_ARGS, "--out", str(out)], tmp_path,
                STANDIN_ELAPSED_MS="alltoall=100,deepep=80")
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(out)
    arms = [r for r in recs if r["schema"] == "moebench.megatron.arm/1"]
    assert [(r["dispatcher"], r["repeat"]) for r in arms] == [("alltoall", 0), ("deepep", 0), ("alltoall", 1), ("deepep", 1)]
    dep = arms[1]
    assert dep["dispatcher_flags"] == ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
    assert dep["megatron_argv"][:-6] == arms[0]["megatron_argv"][:-4]          # only the dispatcher flags differ
    assert {(d["class"], d["manager"]) for e in dep["evidence"] for d in e["dispatchers"]} == \
        {("MoEFlexTokenDispatcher", "_DeepepManager")}
    assert all(e["buffer"]["class"].endswith("Buffer") for e in dep["evidence"]) and len(dep["evidence"]) == 2
    assert dep["no_te_flags"][:2] == ["--transformer-impl", "local"] and dep["engine"] == "megatron-lm pretrain_gpt.py"
    assert dep["megatron_args"]["moe_token_dispatcher_type"] == "flex" and dep["steady"]["window"] == 3
    [v] = [r for r in recs if r["schema"] == "moebench.megatron.verdict/1"]
    assert v["verdict"] == "SWITCH" and v["functional"] and v["loss"]["match"]
    assert "deepep differs from the control only in: --moe-token-dispatcher-type flex" in p.stdout
    assert max(map(len, p.stdout.splitlines())) <= 160 and "# candidate deepep: " in p.stdout


@needs_mcore
@pytest.mark.slow
def test_a_crashing_and_a_hanging_arm_fail_and_the_others_run(tmp_path):
    out = tmp_path / "v.jsonl"
    p = run_cli(["validate", "--dispatcher", "deepep,hybridep", *STANDIN_ARGS, "--repeats", "1", "--timeout", "40",
                 "--out", str(out)], tmp_path, STANDIN_FAIL="deepep:crash@3,hybridep:hang@2")
    assert p.returncode == 1
    arms = {r["dispatcher"]: r for r in records(out) if r["schema"] == "moebench.megatron.arm/1"}
    assert arms["alltoall"]["status"] == "PASS"
    assert arms["deepep"]["status"] == "FAIL" and "stand-in: deepep crashed at iteration 3" in arms["deepep"]["error_lines"][-1]
    assert arms["hybridep"]["status"] == "FAIL" and arms["hybridep"]["errors"][0].startswith("hang")
    assert "pretrain_gpt.py" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@needs_mcore
@pytest.mark.slow
def test_arms_launched_by_torchrun_joined_by_compare(tmp_path):
    out = tmp_path / "arms.jsonl"
    for disp in ("alltoall", "hybridep"):
        e = {**os.environ, "FAKE_DEEP_EP_CTOR": "sim", "PYTHONPATH": f"{ROOT / 'tests' / 'fakes'}:{ROOT}",
             "STANDIN_ELAPSED_MS": "alltoall=100,hybridep=130"}
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "moebench.megatron", "arm", "--dispatcher", disp, *STANDIN_ARGS, "--out", str(out)],
                           cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    p = run_cli(["compare", str(out)], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "hybridep vs alltoall: KEEP" in p.stdout
    assert [r["launch"]["launcher"] for r in records(out)] == ["torchrun", "torchrun"]


def test_compare_refuses_a_malformed_arm_record_with_file_and_line(tmp_path):
    f = tmp_path / "arms.jsonl"
    good = {**arm("alltoall", 100), "repeat": 0}
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "dispatcher": "nccl-ep"}) + "\n")
    assert megatron.main(["compare", str(f)]) == 2
    f.write_text(json.dumps({**good, "steady": None}) + "\n")
    assert megatron.main(["compare", str(f)]) == 2
    f.write_text(json.dumps({"schema": "moebench.result/1"}) + "\n")
    assert megatron.main(["compare", str(f)]) == 2


# ---------------------------------------------------------------- compare: what it refuses, before any verdict
def full_arm(disp, ms, repeat):
    """An arm record with every part the table and the verdict read (evidence, Megatron's memory reports)."""
    cls = "MoEAlltoAllTokenDispatcher" if disp == "alltoall" else "MoEFlexTokenDispatcher"
    return {**arm(disp, ms, repeat, mem=[{"rank": 0, "max_reserved_bytes": 2**30, "process_bytes": 2**30}]),
            "memory": {"megatron": [{"rank": 0, "after_iterations": 1, "max_reserved_MB": 1024.0}],
                       "ranks": [{"rank": 0, "max_reserved_bytes": 2**30, "process_bytes": 2**30}]},
            "evidence": [{"rank": 0, "dispatchers": [{"class": cls, "manager": None, "calls": 10}]}]}


def good_arms():
    """Lines 1-4: control, candidate (deepep, 20% faster), control, candidate: SWITCH when nothing is wrong."""
    return [full_arm(d, ms, r) for r in (0, 1) for d, ms in (("alltoall", 100.0), ("deepep", 80.0))]


def _each_loss(value):
    return lambda r: [i.update(lm_loss=value) for i in r["iterations"]]


NAN, INF, ALL = float("nan"), float("inf"), (1, 2, 3, 4)
MALFORMED = [       # (id, the lines changed, the change, the line named, what the refusal says)
    ("no-order", (2,), lambda r: r.pop("order"), 2, "order is missing"),
    ("steady-without-mean", (2,), lambda r: r["steady"].pop("mean_ms"), 2, "steady.mean_ms is missing"),
    ("fail-errors-ints", (2,), lambda r: r.update(status="FAIL", errors=[1, 2]), 2, "errors[0] is 1, not a string"),
    ("iterations-strings", (2,), lambda r: r.update(iterations=["x"]), 2, "iterations[0] is 'x', not an object"),
    ("iterations-ints", (2,), lambda r: r.update(iterations=[1, 2, 3]), 2, "iterations[0] is 1, not an object"),
    ("iteration-without-number", (2,), lambda r: r["iterations"][0].pop("iteration"), 2,
     "iterations[0].iteration is missing"),
    ("loss-text", (2,), lambda r: r["iterations"][0].update(lm_loss="high"), 2,
     "iterations[0].lm_loss is 'high', not a number"),
    ("megatron-memory-nan", (2,), lambda r: r["memory"]["megatron"][0].update(max_reserved_MB=NAN), 2,
     "memory.megatron[0].max_reserved_MB is NaN"),
    ("megatron-memory-inf", (2,), lambda r: r["memory"]["megatron"][0].update(max_reserved_MB=INF), 2,
     "memory.megatron[0].max_reserved_MB is Infinity"),
    ("argv-int", (2,), lambda r: r.update(megatron_argv=5), 2, "megatron_argv is 5, not a list of strings"),
    ("evidence-text", (2,), lambda r: r.update(evidence="x"), 2, "evidence is 'x', not a list"),
    ("evidence-lists", (2,), lambda r: r.update(evidence=[[1]]), 2, "evidence[0] is a JSON list, not an object"),
    ("evidence-no-manager", (2,), lambda r: r["evidence"][0]["dispatchers"][0].pop("manager"), 2,
     "evidence[0].dispatchers[0].manager is missing"),
    ("memory-rank-list", (2,), lambda r: r["memory"]["ranks"][0].update(rank=[0]), 2,
     "memory.ranks[0].rank is a JSON list"),
    ("memory-rank-text", (2,), lambda r: r["memory"]["ranks"][0].update(rank="zero"), 2,
     "memory.ranks[0].rank is 'zero'"),
    # impossible figures, each of which made a verdict
    ("loss-nan-everywhere", ALL, _each_loss(NAN), 1, "iterations[0].lm_loss is NaN: not a finite number > 0"),
    ("loss-inf-in-control", (1,), lambda r: r["iterations"][4].update(lm_loss=INF), 1,
     "iterations[4].lm_loss is Infinity"),
    ("loss-zero-everywhere", ALL, _each_loss(0.0), 1, "iterations[0].lm_loss is 0.0: not a finite number > 0"),
    ("loss-negative-everywhere", ALL, _each_loss(-1.0), 1, "iterations[0].lm_loss is -1.0"),
    ("samples-tiny", (2, 4), lambda r: r["steady"].update(samples_ms=[1e-300] * 10), 2,
     "steady.samples_ms[0] is 1e-300"),
    ("samples-huge", (2, 4), lambda r: r["steady"].update(samples_ms=[1e300] * 10), 2,
     "steady.samples_ms[0] is 1e+300"),
]
ON_THE_COMMAND_LINE = ("no-order", "steady-without-mean", "fail-errors-ints", "iterations-ints", "loss-text",
                       "megatron-memory-nan", "argv-int", "evidence-lists", "memory-rank-list", "loss-nan-everywhere",
                       "samples-tiny", "samples-huge", "loss-zero-everywhere")


def arms_file(tmp_path, lines=(), change=None, name="arms.jsonl"):
    recs = good_arms()
    for n in lines:
        change(recs[n - 1])
    f = tmp_path / name
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


@pytest.mark.parametrize("lines, change, line, says", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_compare_refuses_each_field_the_table_and_the_verdict_read(lines, change, line, says, tmp_path, capsys):
    f = arms_file(tmp_path, lines, change)
    assert megatron.main(["compare", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moebench.megatron compare: error: {f}:{line}: ") and says in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("lines, change, line, says", [m[1:] for m in MALFORMED if m[0] in ON_THE_COMMAND_LINE],
                         ids=[m[0] for m in MALFORMED if m[0] in ON_THE_COMMAND_LINE])
def test_compare_cli_refuses_a_malformed_or_impossible_arm_with_file_and_line(lines, change, line, says, tmp_path):
    f = arms_file(tmp_path, lines, change)
    p = run_cli(["compare", str(f)], tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == "", p.stderr
    assert p.stderr.startswith(f"moebench.megatron compare: error: {f}:{line}: ") and says in p.stderr
    assert len(p.stderr.splitlines()) == 1


def test_compare_gives_the_verdict_of_good_arms_and_fails_a_failed_arm_whatever_its_times(tmp_path, capsys):
    assert megatron.main(["compare", str(arms_file(tmp_path))]) == 0
    assert "deepep vs alltoall: SWITCH" in capsys.readouterr().out

    def failed(r):          # a FAIL arm's times are printed, not judged: a zero time is why it failed
        r.update(status="FAIL", errors=["elapsed time per iteration not a finite positive number"])
        r["steady"].update(mean_ms=0.0, samples_ms=[0.0])
    assert megatron.main(["compare", str(arms_file(tmp_path, (2,), failed))]) == 1
    assert "deepep vs alltoall: FAIL - deepep repeat 0 FAILED: elapsed time" in capsys.readouterr().out


@pytest.mark.parametrize("second", ["same", "other-spelling"])
def test_compare_refuses_a_file_given_twice(second, tmp_path):
    f = arms_file(tmp_path)
    (tmp_path / "sub").mkdir()
    again = str(f) if second == "same" else str(tmp_path / "sub" / ".." / f.name)
    p = run_cli(["compare", str(f), again], tmp_path)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith(f"moebench.megatron compare: error: {again}") and "given twice" in p.stderr


def test_compare_refuses_a_line_it_cannot_read_and_says_what_a_file_without_arms_holds(tmp_path, capsys):
    """It judged what was left after skipping such a line, and said only "no arm records" of a file of other
    records (issue 50)."""
    f = arms_file(tmp_path)
    f.write_text(f.read_text() + "12345678901234567890123456789\n")
    n = len(f.read_text().splitlines())
    assert megatron.main(["compare", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"moebench.megatron compare: error: {f}:{n}: a 29-digit integer, not a record object; "
                                "refused: no verdict is drawn from a file with a line it cannot read"]
    other = tmp_path / "other.jsonl"
    other.write_text('{"schema": "moebench.result/1"}\n{"x": 1}\n')
    assert megatron.main(["compare", str(other)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "(it holds 1 moebench.dispatch record, 1 object of no known kind; " in err


def test_a_checkout_from_the_environment_is_named_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEGATRON_LM", str(tmp_path / "gone"))
    assert megatron.main(["validate", "--dispatcher", "hybridep", "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"moebench.megatron validate: error: $MEGATRON_LM {tmp_path / 'gone'}: not a "
                                "directory (a Megatron-LM checkout holding pretrain_gpt.py)"]


def test_compare_refuses_the_same_arm_records_in_two_files(tmp_path):
    f, copy = arms_file(tmp_path), arms_file(tmp_path, name="copy.jsonl")
    p = run_cli(["compare", str(f), str(copy)], tmp_path)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr == (f"moebench.megatron compare: error: {copy}:1: the same arm record as {f}:1 (alltoall repeat 0, "
                        "launch 0 of validation v1): it would count twice\n")

    # the same schedule launched again later: other launches, not copies
    later = arms_file(tmp_path, ALL, lambda r: r.update(start_utc="2025-01-02T00:00:00Z"), name="later.jsonl")
    assert megatron.main(["compare", str(f), str(later)]) == 0


# ---------------------------------------------------------------- flags and validate: refused before any work
@pytest.mark.parametrize("version", ["", " ", "0.19garbage"])
def test_flags_cli_refuses_an_empty_or_malformed_core_version(version, tmp_path):
    p = run_cli(["flags", "--backend", "deepep", "--megatron-core-version", version], tmp_path)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, p.stdout + p.stderr
    assert p.stderr.startswith("moebench.megatron flags: error: --megatron-core-version must be a megatron-core "
                               f"version such as 0.16.1 or 0.19.2, got {version!r}")


@pytest.mark.parametrize("version", ["0.19.2", "v0.16", "0.16.0rc1", "0.15.0.dev0", "0.19.0+local"])
def test_flags_takes_versions_as_pip_writes_them(version, capsys):
    assert megatron.main(["flags", "--backend", "deepep", "--megatron-core-version", version]) == 0
    assert "--moe-flex-dispatcher-backend deepep" in capsys.readouterr().out


@pytest.mark.parametrize("cmd", [["flags", "--backend", "deepep", "--megatron-core-version", "0.19.2"],
                                 ["compare", "arms.jsonl"]], ids=["flags", "compare"])
@pytest.mark.parametrize("gain", ["1", "2"])
def test_min_gain_of_one_or_more_is_refused_alike(cmd, gain, tmp_path):
    p = run_cli([*cmd, "--min-gain", gain], tmp_path)
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr == f"moebench.megatron {cmd[0]}: error: --min-gain must be a finite number >= 0 and < 1, got {gain}\n"


def test_quick_validate_refuses_a_window_not_below_iters_before_any_work(tmp_path):
    out = tmp_path / "v.jsonl"
    p = run_cli(["validate", "--device", "cpu", "--quick", "--dispatcher", "alltoall", "--iters", "5", "--window", "10",
                 "--out", str(out)], tmp_path)
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr == ("moebench.megatron validate: error: --window 10 must be below --iters 5 (the first iterations "
                        "warm up)\n")
    assert not out.exists()
