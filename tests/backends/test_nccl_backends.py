"""ncclep and deepep-v2 without their libraries: availability read from files (never an import), what each refuses
at parse time, the native output a failed first call is reported with, and the Megatron lookup."""
import os
import subprocess
import sys

import pytest

from moebench.backends import get
from moebench.backends.deepep_v2 import DeepEPV2Backend
from moebench.backends.nccl_family import (GIN_ENV, GIN_NOTE, MULTI_RANK_ENV, MULTI_RANK_NOTE, NativeFailure,
                                           native_output, share_gpu)
from moebench.backends.ncclep import NcclEPBackend
from moebench.core.workload import Workload, WorkloadError
from moebench.megatron.flags import FlagsError, megatron_flags


def wl(**kw):
    return Workload(**{**dict(num_tokens=64, hidden=2048, num_experts=16, topk=4, ep=2, gpus_per_node=8), **kw})


def test_registered_under_their_names_and_cuda_only():
    assert get("ncclep") is NcclEPBackend and get("deepep-v2") is DeepEPV2Backend
    assert "CUDA" in NcclEPBackend.cpu_problem({}) and "CUDA" in DeepEPV2Backend.cpu_problem({})


def test_deepep_v1_or_v2_told_from_the_files(tmp_path, monkeypatch):
    """available() never imports deep_ep: V2 is the package with buffers/elastic.py (V1 and V2 share the name)."""
    pkg = tmp_path / "deep_ep"
    (pkg / "buffers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ok, why = DeepEPV2Backend.available()
    assert not ok and "deep_ep here is V1" in why and "elastic.py" in why
    (pkg / "buffers" / "elastic.py").write_text("")
    assert DeepEPV2Backend.available() == (True, "")


def test_ncclep_missing_names_the_install_line():
    ok, why = NcclEPBackend.available()
    if not ok:
        assert "nccl-extensions" in why and "pip install" in why and "2.30.4" in why


@pytest.mark.parametrize("knobs, kw, msg", [
    ({"mode": "ht"}, dict(num_tokens=9000), "at most 8192 tokens"),
    ({"mode": "ht"}, dict(num_experts=6, ep=2, gpus_per_node=2), "multiple of 4"),
    ({"mode": "ht"}, dict(hidden=1004), "16-byte words"),
    ({"mode": "ht"}, dict(dtype="fp8", hidden=1152), "multiple of 512"),
    ({"mode": "ll"}, dict(topk=33, num_experts=64), "--topk <= 32"),
    ({"mode": "ll"}, dict(hidden=1000), "divisible by 128"),
    ({"mode": "ll", "num_sms": 2}, dict(num_experts=64), "--num-sms >= 5"),
])
def test_ncclep_refuses_what_nccl_ep_refuses(knobs, kw, msg):
    with pytest.raises(WorkloadError, match=msg):
        NcclEPBackend(knob_values=knobs).validate(wl(**kw), kw.get("ep", 2))


def test_ncclep_zero_copy_is_hts_and_needs_a_library_with_it(tmp_path, monkeypatch):
    """zero_copy=1 on ll, or with an NCCL EP whose enums have no ZeroCopyMode: one line naming why; ht takes it
    (on by default) and zero_copy=0 anywhere."""
    with pytest.raises(WorkloadError, match="zero_copy=1: ll has no zero-copy combine"):
        NcclEPBackend(knob_values={"mode": "ll", "zero_copy": 1}).validate(wl(), 2)
    NcclEPBackend(knob_values={"mode": "ll", "zero_copy": 0}).validate(wl(), 2)
    assert NcclEPBackend(knob_values={"mode": "ht"}).zero_copy and not NcclEPBackend(knob_values={"mode": "ll"}).zero_copy
    old = tmp_path / "enums.py"
    old.write_text("class Algorithm: pass\n")
    monkeypatch.setattr("moebench.backends.ncclep.package_file", lambda module, rel: old)
    with pytest.raises(WorkloadError, match="has no ZeroCopyMode .* use zero_copy=0"):
        NcclEPBackend(knob_values={"mode": "ht", "zero_copy": 1}).validate(wl(), 2)
    NcclEPBackend(knob_values={"mode": "ht", "zero_copy": 0}).validate(wl(), 2)


def test_ncclep_takes_both_modes_and_fp8():
    for mode in ("ht", "ll"):
        NcclEPBackend(knob_values={"mode": mode}).validate(wl(), 2)
        NcclEPBackend(knob_values={"mode": mode}).validate(wl(dtype="fp8"), 2)
    with pytest.raises(WorkloadError, match="mode"):
        NcclEPBackend(knob_values={"mode": "fast"}).validate(wl(), 2)


def test_deepep_v2_refuses_rows_and_knobs_it_cannot_take():
    DeepEPV2Backend().validate(wl(dtype="fp8"), 2)
    with pytest.raises(WorkloadError, match="16-byte words"):
        DeepEPV2Backend().validate(wl(hidden=1004), 2)
    with pytest.raises(WorkloadError, match="num_qps"):
        DeepEPV2Backend(knob_values={"num_qps": -1}).validate(wl(), 2)
    DeepEPV2Backend(knob_values={"expand": 1, "deterministic": 1}).validate(wl(), 2)


CAPTURED = """
import ctypes, os, sys
from moebench.backends.nccl_family import native_output, NativeFailure
with native_output("quiet call"):
    os.write(1, b"compiled fine\\n")
try:
    with native_output("first dispatch"):
        for i in range(20):
            os.write(2, f"nvcc line {i}\\n".encode())
        ctypes.CDLL(None).printf(b"kernel.cu(7): error via C stdio\\n")    # buffered: stdout is a file here
        raise RuntimeError("NCCL EP error code 3")
except NativeFailure as e:
    print("ERROR:", e)
"""


def test_native_output_passes_text_on_and_a_failure_carries_its_last_lines():
    p = subprocess.run([sys.executable, "-c", CAPTURED], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "compiled fine" in p.stderr and "nvcc line 0" in p.stderr     # the native text still reaches the user
    err = next(line for line in p.stdout.splitlines() if line.startswith("ERROR:"))
    assert "first dispatch: RuntimeError: NCCL EP error code 3" in err
    assert "nvcc line 19" in err and "nvcc line 9" in err and "nvcc line 8 " not in err + " "
    assert err.rstrip().endswith("kernel.cu(7): error via C stdio")      # C's buffer flushed before the fds return


def test_shared_gpu_ranks_turn_on_nccl_multi_rank_and_a_backends_own_bypass(monkeypatch):
    monkeypatch.delenv(MULTI_RANK_ENV, raising=False)
    monkeypatch.delenv(GIN_ENV, raising=False)
    assert share_gpu(1, {GIN_ENV: GIN_NOTE}) == [] and MULTI_RANK_ENV not in os.environ and GIN_ENV not in os.environ
    notes = share_gpu(2, DeepEPV2Backend.shared_gpu_bypasses)
    assert "NCCL >= 2.30" in notes[0] and os.environ[MULTI_RANK_ENV] == "1"
    assert notes[1] == GIN_NOTE and "NCCL GIN is unavailable" in notes[1] and os.environ[GIN_ENV] == "1"
    assert share_gpu(2) == [MULTI_RANK_NOTE] and NcclEPBackend.shared_gpu_bypasses == {}


def test_native_failure_is_an_exception_a_stage_reports():
    with pytest.raises(NativeFailure, match="x: ValueError: bad"):
        with native_output("x"):
            raise ValueError("bad")


def test_megatron_flags_ncclep_and_no_path_for_deepep_v2():
    f = megatron_flags("ncclep", "0.19.2", ep=8, capacity_factor=2.0)
    base = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "ncclep",
            "--moe-expert-rank-capacity-factor", "2"]
    # moebench times ncclep with Megatron's static shape + zero copy by default: the flags say so, with what 0.19
    # requires of them; a run timed without (zero_copy=0) gets neither
    assert f.megatron_lm == [*base, "--moe-ncclep-static-shape", "--moe-ncclep-zero-copy", "--moe-grouped-gemm",
                             "--use-transformer-engine-op-fuser"]
    assert "model.moe_ncclep_zero_copy=true" in f.megatron_bridge
    assert any("Transformer Engine" in n and "NCCL EP" in n for n in f.notes)
    assert any("requires --moe-ncclep-static-shape for --moe-ncclep-zero-copy" in n for n in f.notes)
    assert megatron_flags("ncclep", "0.19.2", ep=8, capacity_factor=2.0, zero_copy=False).megatron_lm == base
    said = " | ".join(megatron_flags("ncclep", "0.19.2", ep=4, tp=2, zero_copy=False).notes)
    assert "bf16 payloads only" in said and "_require_bf16" in said and "Transformer Engine 2.18 exactly" in said
    assert "top-k x TP (2)" in said and "--moe-ncclep-static-shape" in said and "num_topk" in said
    assert "accepted with flex on megatron-core 0.19" in said and "alltoall only" in " ".join(
        megatron_flags("deepep", "0.16.1", ep=8).notes)
    with pytest.raises(FlagsError, match="no ncclep dispatcher"):
        megatron_flags("ncclep", "0.16.1", ep=8)
    with pytest.raises(FlagsError, match="TP x EP > 1"):
        megatron_flags("ncclep", "0.19.2", ep=1)
    with pytest.raises(FlagsError, match="no path to DeepEP V2"):
        megatron_flags("deepep-v2", "0.19.2", ep=8)


def test_ncclep_num_sms_0_is_the_librarys_default_and_the_record_names_the_split():
    """NCCL EP's AUTO puts ht's communication on 16 SMs and its local shuffle on every SM; an explicit count puts both
    on it (nccl_ep.cc): 0 asks for the default, and the knobs say which split ran."""
    assert NcclEPBackend.KNOBS["num_sms"].problem(0) == "" and NcclEPBackend.KNOBS["num_sms"].problem(-1)
    auto, sixteen = NcclEPBackend(knob_values={"mode": "ht", "num_sms": 0}), NcclEPBackend(knob_values={"mode": "ht",
                                                                                                        "num_sms": 16})
    assert auto.sms_used() == sixteen.sms_used() == 16
    assert auto.sms_split() == "communication 16, local shuffle every SM, preprocessing every SM"
    assert sixteen.sms_split() == "communication 16, local shuffle 16, preprocessing every SM"
    NcclEPBackend(knob_values={"mode": "ll", "num_sms": 0}).validate(wl(num_experts=64), 2)
