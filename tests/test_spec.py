"""RunSpec: built once from the dispatch flags, and its to_argv() rebuilds an equal spec."""
import pytest

from moebench import dispatch
from moebench.core.workload import Workload, WorkloadError
from moebench.harness import launch
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
])
def test_to_argv_round_trip(argv):
    spec = spec_of(argv)
    again = spec_of(spec.to_argv())
    assert again == spec
    assert again.to_argv() == spec.to_argv()


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


def test_pick_device_counts_gpus_per_ranks_per_gpu(monkeypatch):
    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 2)
    device, note = launch.pick_device("cuda", 4, ranks_per_gpu=2)
    assert device == "cuda" and "functional only" in note
    assert launch.pick_device("auto", 4, ranks_per_gpu=4)[0] == "cuda"     # shared ranks never fall back to CPU
    assert launch.pick_device("auto", 4)[0] == "cpu"
    with pytest.raises(WorkloadError, match="needs 4 GPUs but 2"):
        launch.pick_device("cuda", 4)
    with pytest.raises(WorkloadError, match="needs 3 GPUs but 2"):
        launch.pick_device("auto", 6, ranks_per_gpu=2)
    with pytest.raises(WorkloadError, match="--device cpu"):
        launch.pick_device("cpu", 4, ranks_per_gpu=2)


def test_shared_gpu_without_a_gpu_is_one_line_and_exit_2(capsys):
    assert dispatch.main(["--ep", "2", "--ranks-per-gpu", "2", "--backend", "alltoall", "--device", "cpu"]) == 2
    assert "--ranks-per-gpu 2 shares GPUs" in capsys.readouterr().err


def test_functional_options():
    spec = RunSpec(Workload(num_tokens=16, hidden=64, num_experts=8, topk=2, ep=2), ("alltoall",), device="cuda")
    assert not spec.functional
    assert spec.replace(ranks_per_gpu=2).functional and spec.replace(device="cpu").functional
