"""GPU tier: every backend through the oracle, dispatch and combine, in bf16 and (where the backend carries it)
fp8, in each of its modes, at one small shape, as the main job runs them: EP 2, one rank per GPU where two are
visible, else two ranks sharing GPU 0 (functional). A backend whose package is missing here is skipped with its
WAIVED reason, unless MOEBENCH_EXPECT_BACKENDS names it (the device round sets it where it put the packages
there): then WAIVED fails.

One test per backend (per mode where it has several): its cases run in one launch of rank processes
(harness/runner.run_cases), so the ranks' start, imports and the library's in-process JIT caches are paid once, not
per case; HybridEP also
loads the kernels its earlier cases compiled (knob load_cached_kernels, a cache folder of the test's own). A case
that fails in the shared launch is run again alone, as the main job runs it, and that run decides: a case that
passes only alone warns, naming the case that shared its launch.

DeepEP V1 (branch hybrid-ep) and V2 share the package name deep_ep, so one process holds one of them: where
MOEBENCH_DEEPEP_V2_PATH names a DeepEP V2 build, deepep-v2's rank processes start with that build first on their
path (ranks take the parent's sys.path at their launch; the NCCL it needs is the process's, env/nccl.py); this process
never imports deep_ep."""
import os
import warnings

import pytest
import torch

from conftest import first_on_path
from moebench import dispatch
from moebench.backends import base
from moebench.core.workload import WorkloadError
from moebench.harness.runner import run_cases
from moebench.harness.spec import RunSpec
from moebench.records import schema

SHAPE = ["--num-tokens", "64", "--hidden", "2048", "--num-experts", "16", "--topk", "4"]   # every backend takes it
EXPECT = [n for n in os.environ.get("MOEBENCH_EXPECT_BACKENDS", "").split(",") if n]
V2_PATH = os.environ.get("MOEBENCH_DEEPEP_V2_PATH", "")
MODES = {"ncclep": ["ht", "ll"]}                        # backends with several modes: a test each
EXTRA = {("ncclep", "ht"): [("zero_copy0", ["--knob", "zero_copy=0"])]}   # bf16 cases beside the defaults, one launch


def units():
    """(backend, mode) of each test, Megatron's dispatchers first: the longest (megatron's import, torch.compile of
    its dispatch preprocessing, HybridEP's nvcc runs: 20-50 s each in bench/results/gpu-tier-h100.log), so that
    side-by-side workers start on them (conftest.slow_first)."""
    for name in reversed(base.names()):
        for mode in MODES.get(name, [None]):
            yield pytest.param(name, mode, id=f"{name}-{mode}" if mode else name)


def cases(name: str, mode: str | None, cache_dir) -> list[tuple[str, list[str]]]:
    """(label, the main job's argv) of each case of backend `name` in `mode`: bf16 and, where carried, fp8; and its
    EXTRA variants in bf16 (ncclep ht without zero copy)."""
    shared = ["--ranks-per-gpu", "2"] if torch.cuda.device_count() < 2 else []
    extra = (["--knob", "load_cached_kernels=1", "--knob", f"env:HYBRID_EP_CACHE_DIR={cache_dir}"]
             if name == "hybridep" else [])
    dtypes = ("bf16", "fp8") if base.get(name).supports_fp8 else ("bf16",)
    knobs = ["--knob", f"mode={mode}"] if mode else []
    variants = [("", []), *EXTRA.get((name, mode), [])]
    return [("-".join([name, *([mode] if mode else []), *([tag] if tag else []), dtype]),
             ["--device", "cuda", "--ep", "2", *shared, *SHAPE, "--dtype", dtype, "--backend", name, *knobs, *more,
              *extra, "--views", "api", "--iters", "2", "--warmup-ms", "0", "--timeout", "120"])
            for tag, more in variants for dtype in (dtypes if not tag else ("bf16",))]


def spec_of(argv: list[str]) -> RunSpec:
    return RunSpec.from_args(dispatch.parser().parse_args(argv)).check()


def run(name: str, argvs: list[list[str]]) -> list[list[dict]]:
    specs = [spec_of(a) for a in argvs]
    with first_on_path(V2_PATH if name == "deepep-v2" else ""):
        return run_cases(specs, name)


def problem(label: str, dtype: str, recs: list[dict]) -> str:
    """Why the case's records are not a pass of the oracle in its dtype ('' when they are)."""
    phases = [(r["phase"], r["check"]["status"]) for r in recs if r["phase"] in ("dispatch", "combine")]
    if schema.exit_code(recs) != 0 or phases != [("dispatch", "PASS"), ("combine", "PASS")]:
        return f"{label}: {[r['check'] for r in recs]}"
    return "" if {r["workload"]["dtype"] for r in recs} == {dtype} else f"{label}: not all records are {dtype}"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name,mode", list(units()))
def test_backend_passes_the_oracle(tmp_path, name, mode):
    ok, why = base.get(name).available()
    if not ok and not (name == "deepep-v2" and V2_PATH):
        assert name not in EXPECT, f"{name} is expected here (MOEBENCH_EXPECT_BACKENDS) but WAIVED: {why}"
        pytest.skip(f"{name} WAIVED here: {why}")
    todo = cases(name, mode, tmp_path / "jit")
    if not base.get(name).supports_fp8:                 # refused before any work, as the main job refuses it
        bf16 = todo[0][1]
        with pytest.raises(WorkloadError, match="cannot carry fp8"):
            spec_of([*bf16[:bf16.index("--dtype") + 1], "fp8", *bf16[bf16.index("--dtype") + 2:]])
    got = run(name, [argv for _, argv in todo])
    waived = [r["check"].get("error") for recs in got for r in recs if r["check"]["status"] == "WAIVED"]
    if waived and name not in EXPECT:
        pytest.skip(f"{name} WAIVED here: {waived[0]}")
    bad = []
    for (label, argv), recs in zip(todo, got):
        dtype = argv[argv.index("--dtype") + 1]
        if not problem(label, dtype, recs):
            continue
        [alone] = run(name, [argv])                     # as the main job runs it: a launch of its own
        if problem(label, dtype, alone):
            bad.append(problem(label, dtype, alone))
        else:
            warnings.warn(f"{label} failed in the launch it shared with {[c for c, _ in todo if c != label]} and "
                          f"passed alone: {problem(label, dtype, recs)[:600]}")
    assert not bad, bad
