"""RunSpec: settings declared once (flags, to_argv round trip), placement of the ranks, knobs a run's backends
must read (a --knob or sweep knob axis none reads is one line, exit 2)."""
from pathlib import Path
import importlib
import re

import pytest

from moebench import dispatch
from moebench.backends import base
from moebench.core.workload import Workload, WorkloadError
from moebench.harness import placement
from moebench.harness.spec import RunSpec


def spec_of(argv):
    return RunSpec.from_args(dispatch.parser().parse_args(argv))


@pytest.mark.parametrize("argv", [
    ["--device", "cpu", "--ep", "2", "--num-experts", "8", "--topk", "2"],
    ["--device", "cpu", "--ep", "4", "--num-tokens", "64", "--hidden", "128", "--num-experts", "16", "--topk", "3",
     "--dtype", "fp8", "--routing", "zipf:1.2,masked:0.1", "--seed", "7", "--backend", "alltoall,hybridep",
     "--iters", "3", "--warmup-ms", "5", "--num-sms", "24", "--ops-impl", "torch", "--knob", "mode=plain",
     "--knob", "env:NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API=128", "--no-flush-l2", "--profile",
     "--ceiling-gbps", "450", "--timeout", "30", "--out", "x.jsonl", "--graph-calls", "2"],
    ["--device", "cpu", "--ep", "2", "--num-experts", "8", "--topk", "2", "--inject", "stall:1@2:7.5", "--watchdog",
     "20", "--pg-timeout", "4", "--recreate", "--soak", "6", "--soak-recreate", "3"],
])
def test_to_argv_round_trip(argv):
    spec = spec_of(argv)
    again = spec_of(spec.to_argv())
    assert again == spec
    assert again.to_argv() == spec.to_argv()


def test_the_process_groups_timeout_gives_an_injected_fault_room_before_the_watchdog():
    base_argv = ["--device", "cpu", "--ep", "2", "--num-experts", "8", "--topk", "2", "--timeout", "40"]
    assert spec_of(base_argv).pg_timeout == 40 and spec_of([*base_argv, "--pg-timeout", "3"]).pg_timeout == 3
    injected = spec_of([*base_argv, "--inject", "kill:1@1"])
    assert (injected.watchdog, injected.pg_timeout) == (40, 20)
    assert spec_of([*base_argv, "--inject", "kill:1@1", "--watchdog", "10"]).pg_timeout == 5


def test_from_args_resolves_cpu_defaults_and_knobs():
    spec = spec_of(["--device", "cpu", "--ep", "2", "--num-experts", "8", "--topk", "2", "--num-sms", "8",
                    "--knob", "env:CHUNK=64", "--knob", "mode=plain"])
    assert (spec.workload.num_tokens, spec.workload.hidden, spec.iters, spec.warmup_ms) == (256, 1024, 5, 0.0)
    assert not spec.explicit and "alltoall" in spec.backends
    assert spec.backend_knobs == {"ops_impl": "auto", "num_sms": 8, "mode": "plain"} and spec.env == {"CHUNK": "64"}
    assert spec.ranks_per_gpu == 1


def test_bad_knob_and_explicit_backend_that_cannot_run():
    with pytest.raises(WorkloadError, match="KEY=VALUE"):
        spec_of(["--device", "cpu", "--knob", "oops"])
    spec = RunSpec(Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2), ("alltoall",), explicit=True)
    assert spec.check() is spec
    with pytest.raises(SystemExit):             # a range check of the parser now: one line, exit 2
        spec_of(["--ranks-per-gpu", "0"])


def test_placement_counts_gpus_per_ranks_per_gpu():
    p = placement.place("cuda", 4, ranks_per_gpu=2, ngpu=2)
    assert p.device == "cuda" and "functional only" in p.note and p.gpus_needed == 2 and p.functional
    assert placement.place("auto", 4, ranks_per_gpu=4, ngpu=2).device == "cuda"   # shared ranks never fall back to CPU
    cpu = placement.place("auto", 4, ngpu=2)
    assert cpu.device == "cpu" and cpu.functional and "CPU/gloo" in cpu.note and cpu.gpus_needed == 0
    assert not placement.place("auto", 2, ngpu=2).functional
    with pytest.raises(WorkloadError, match="needs 4 GPUs but 2"):
        placement.place("cuda", 4, ngpu=2)
    with pytest.raises(WorkloadError, match="needs 3 GPUs but 2"):
        placement.place("auto", 6, ranks_per_gpu=2, ngpu=2)
    with pytest.raises(WorkloadError, match="--device cpu was asked for"):
        placement.place("cpu", 4, ranks_per_gpu=2, ngpu=2)
    with pytest.raises(WorkloadError, match="the launcher started 3"):
        placement.place("auto", 4, joined=(0, 3, 0), ngpu=0)


def test_shared_gpu_without_a_gpu_is_one_line_and_exit_2(capsys):
    assert dispatch.main(["--ep", "2", "--ranks-per-gpu", "2", "--backend", "alltoall", "--device", "cpu"]) == 2
    assert "--ranks-per-gpu 2 shares GPUs" in capsys.readouterr().err


def test_functional_options():
    spec = RunSpec(Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2), ("alltoall",), device="cuda")
    assert not spec.functional
    assert spec.replace(ranks_per_gpu=2).functional and spec.replace(device="cpu").functional


TINY = ["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--hidden", "64", "--num-experts", "8", "--topk", "2",
        "--iters", "1"]


@pytest.mark.parametrize("backend, knob, listed", [
    ("alltoall", "mode=plain", "alltoall: ops_impl"),
    ("hybridep", "num_sm=8", "num_sms_dispatch"),
    ("alltoall,deepep", "chunk=4", "deepep: num_sms, ops_impl"),
    ("alltoall", "env:=3", "names no variable"),
])
def test_unknown_knob_names_the_flag_and_the_known_knobs(tmp_path, capsys, monkeypatch, backend, knob, listed):
    monkeypatch.setattr(dispatch, "run_case", lambda *a, **k: pytest.fail("ran with an unknown knob"))
    rc = dispatch.main([*TINY, "--backend", backend, "--knob", knob, "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--knob" in err[0] and knob.split("=")[0] in err[0] and listed in err[0], err[0]


def test_known_and_env_knobs_still_pass():
    from moebench.harness.spec import RunSpec
    spec = RunSpec.from_argv([*TINY, "--backend", "all", "--knob", "mode=plain", "--knob", "env:CHUNK=64"])
    assert spec.knobs["mode"] == "plain" and spec.env == {"CHUNK": "64"}
    assert RunSpec.from_argv([*TINY, "--backend", "deepep", "--knob", "num_sms=24"]).knobs["num_sms"] == 24


def test_sweep_knob_axes_are_checked_against_their_backend(tmp_path, capsys):
    sw = tmp_path / "s.toml"
    sw.write_text("num_experts = 8\ntopk = 2\nnum_tokens = 16\nhidden = 64\n[knobs.deepep]\nmode = ['plain']\n")
    rc = dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(sw) in err[0] and "[knobs.deepep]" in err[0] and "num_sms" in err[0]


def names_read(module) -> set[str]:
    """The literal knob names a backend module reads from knob_values."""
    src = Path(module.__file__).read_text()
    return set(re.findall(r"knob_values(?:\.get\(|\[)\"(\w+)\"", src))


def test_each_backend_declares_the_knobs_its_module_reads():
    for name in base.REGISTRY:
        cls = base.get(name)
        mods = [importlib.import_module(k.__module__) for k in cls.__mro__ if k.__module__.startswith("moebench.backends")]
        read = set().union(*(names_read(m) for m in mods))
        extra = set().union(*(getattr(m, t, {}) for m in mods for t in ("SM_KNOBS", "SWITCHES")))   # read via a table
                                                                # (hybridep's SM knobs, deepep-v2's switches)
        own = names_read(importlib.import_module(cls.__module__))       # read somewhere in its module:
        siblings = set().union(*(base.get(n).KNOBS for n in base.REGISTRY if base.get(n).__module__ == cls.__module__))
        assert own <= siblings, (name, own - siblings)                 # declared by a backend of that module
        assert set(cls.KNOBS) - extra <= read | {"ops_impl"} | ({"num_sms"} if name.startswith("mcore") else set()), name


@pytest.mark.parametrize("argv,words", [
    (["--backend", "hybridep", "--knob", "mode=bogus"], ("mode=bogus", "one of permute, plain")),
    (["--backend", "deepep", "--num-sms", "3"], ("--num-sms", "even integer >= 2")),
    (["--backend", "all", "--num-sms", "0"], ("--num-sms", ">= 1")),
    (["--backend", "alltoall", "--num-sms", "8"], ("--num-sms num_sms", "no backend of this run reads")),
    (["--backend", "mcore-alltoall", "--knob", "moe_permute_fusion=2"], ("moe_permute_fusion=2", "one of 0, 1")),
])
def test_knob_values_are_checked_against_what_the_backends_declare(tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.setattr(dispatch, "run_case", lambda *a, **k: pytest.fail("ran with a bad knob value"))
    assert dispatch.main([*TINY, *argv, "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


def test_a_value_one_backend_of_all_takes_passes():
    from moebench.harness.spec import RunSpec
    assert RunSpec.from_argv([*TINY, "--backend", "all", "--num-sms", "3"]).knobs["num_sms"] == 3   # hybridep takes 3
    assert base.Knob(low=2, even=True).problem(3) and not base.Knob(low=2, even=True).problem(4)
    assert base.Knob(choices=(0, 1)).problem(True) == ""                                          # True == 1
