"""python -m moebench.permute on CPU: records per impl and op, bad input exits 2."""
from __future__ import annotations

import json

import pytest

from moebench import permute
from moebench.records import plots
from moebench.env.toolkit import installed


def test_cpu_run_writes_records(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    rc = permute.main(["--ops-impl", "torch,megatron", "--shapes", "32x64x2x4", "--iters", "2",
                       "--out", str(out)])
    assert rc == 0
    assert "CPU times are not performance figures" in capsys.readouterr().out
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["schema"] for r in recs} == {"moebench.permute/1"} and all(r["functional"] for r in recs)
    torch_ops = {r["op"] for r in recs if r["impl"] == "torch"}
    assert torch_ops == {"permute", "permute_wait", "unpermute"}
    assert all(r["check"]["status"] == "PASS" for r in recs if r["impl"] == "torch")
    t = next(r for r in recs if r["impl"] == "torch" and r["op"] == "permute")
    assert t["bytes"] == (32 + t["shape"]["R"]) * 64 * 2 and t["timing"]["iters"] == 2
    mega = [r for r in recs if r["impl"] == "megatron"]
    if not installed("megatron.core"):                     # the rest needs megatron-core
        assert mega and {r["check"]["status"] for r in mega} == {"WAIVED"}
        return
    assert "permute_wait" not in {r["op"] for r in mega}   # megatron needs the row count
    if mega and mega[0]["check"]["status"] == "PASS":
        assert "speedup_vs_megatron" in next(r for r in recs if r["impl"] == "torch"
                                             and r["op"] == "permute_wait")


@pytest.mark.parametrize("argv", [["--shapes", "4x8x5x4"], ["--shapes", "4x8"], ["--ops-impl", "nope"], ["--impl", "nope"],
                                  ["--ops", "gather"], ["--iters", "0"]])
def test_bad_input_exits_2(argv, capsys):
    assert permute.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moebench.permute: ")


@pytest.mark.parametrize("var,value,why", [
    ("MOEBENCH_TRITON_COPY_BH", "abc", "MOEBENCH_TRITON_COPY_BH='abc': must be an integer"),
    ("MOEBENCH_TRITON_SCAN_EB", "3", "MOEBENCH_TRITON_SCAN_EB=3: scan_eb must be a power of 2, not 3"),
    ("MOEBENCH_TRITON_PDL", "2", "pdl must be 0 or 1, not 2"),
    ("MOEBENCH_CUDA_UNPERMUTE_VARIANT", "x", "MOEBENCH_CUDA_UNPERMUTE_VARIANT='x': V and C must be integers"),
    ("MOEBENCH_CUDA_PERMUTE_VARIANT", "16:4", "MOEBENCH_CUDA_PERMUTE_VARIANT='16:4': rows per CTA apply to the rows"),
])
def test_a_kernel_default_set_wrong_in_the_environment_is_refused_before_any_work(var, value, why, monkeypatch,
                                                                                   capsys):
    """Read inside the run, MOEBENCH_TRITON_COPY_BH=abc made FAIL rows that blamed the kernel (issue 50)."""
    monkeypatch.setenv(var, value)
    assert permute.main(["--ops-impl", "torch", "--shapes", "16x32x2x4", "--iters", "1", "--ops", "permute"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.splitlines()) == 1
    assert cap.err.startswith(f"moebench.permute: error: {var}=") and why in cap.err


@pytest.mark.parametrize("impl,why", [("cuda@99999", "variant bits must be in"), ("cuda@16:4", "pick another copy"),
                                      ("triton@1:2:3:4:5:6:7:8:9:10:11:12:13:14", "at most 13 values")])
def test_a_malformed_variant_is_refused_on_any_machine(impl, why, capsys):
    """Before the device is asked whether it can run the impl: the variant's own fault, named."""
    assert permute.main(["--ops-impl", impl, "--ops", "permute"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and "cannot run on this machine" not in err[0], err


def test_out_appends_and_old_flag_names_still_work(tmp_path):
    out = tmp_path / "p.jsonl"
    argv = ["--shapes", "16x32x2x4", "--iters", "1", "--ops", "permute", "--out", str(out)]
    assert permute.main(["--ops-impl", "torch", "--no-flush-l2", *argv]) == 0
    assert permute.main(["--impl", "torch", "--no-flush", *argv]) == 0          # hidden aliases
    assert [json.loads(line)["impl"] for line in out.read_text().splitlines()] == ["torch", "torch"]


# ---------------------------------------------------------------- first contact
def test_plot_title_names_the_device_and_the_path_is_printed(tmp_path, capsys):
    png = tmp_path / "p.png"
    assert permute.main(["--ops-impl", "torch", "--shapes", "16x32x2x4", "--iters", "1",
                         "--ops", "permute", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.stat().st_size > 0 and f"plot written to {png}" in out
    rec = {"timing": {}, "GBps": 1.0, "impl": "torch", "op": "permute", "env": {"gpu": None},
           "shape": {"T": 16, "H": 32}}
    title = plots.plot_permute([rec], 1.0, str(tmp_path / "q.png")).axes[0].get_title()
    assert "None" not in title and "CPU" in title
    assert "NVIDIA H200" in plots.plot_permute([dict(rec, env={"gpu": "NVIDIA H200"})], 1.0,
                                         str(tmp_path / "r.png")).axes[0].get_title()


def test_a_plot_path_matplotlib_cannot_write_is_refused_and_a_bare_name_is_that_file(run_tool, tmp_path):
    """permute --plot x.xyz ended in matplotlib's traceback after the run; --plot NAME wrote NAME.png while it
    said NAME (issue 50)."""
    argv = ["--ops-impl", "torch", "--shapes", "16x32x2x4", "--iters", "1", "--ops", "permute"]
    p = run_tool("moebench.permute", *argv, "--plot", str(tmp_path / "p.xyz"))
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1
    assert p.stderr.startswith(f"moebench.permute: error: --plot {tmp_path / 'p.xyz'}: matplotlib writes no .xyz file")
    bare = tmp_path / "plot"
    p = run_tool("moebench.permute", *argv, "--plot", str(bare))
    assert p.returncode == 0 and f"plot written to {bare}\n" in p.stdout
    assert bare.read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "plot.png").exists()


def test_progress_line_per_shape_and_impl_on_stderr(capsys):
    assert permute.main(["--ops-impl", "torch,te", "--shapes", "16x32x2x4,8x32x2x4", "--iters", "1",
                         "--ops", "permute"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("# ")]
    assert err[0] == "# shape 1/2 16x32x2x4 torch (1/2 impls)"
    assert len(err) == 4 and err[-1].startswith("# shape 2/2 8x32x2x4 te (2/2 impls)")


@pytest.mark.skipif(not installed("megatron.core"), reason="needs megatron-core")
@pytest.mark.slow
def test_no_transformer_engine_warnings_from_megatron_import():
    import subprocess
    import sys
    code = ("import warnings; warnings.simplefilter('always'); from moebench import permute; "
            "permute._megatron()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Transformer Engine and Apex are not installed" not in r.stderr


TE_COMMON = "import triton\n\ndef _permute_kernel():\n    return 'kernel'\n"
TE_TORCH = ("from transformer_engine.common.triton.permutation import _permute_kernel\n\n"
            "def permute_with_mask_map(*args):\n    return _permute_kernel()\n")


def test_te_anchor_loads_from_sources_and_leaves_no_stand_in_package(tmp_path, monkeypatch):
    import sys

    from moebench.ops import te_source
    for rel, text in ((te_source.FILES["transformer_engine.common.triton.permutation"], TE_COMMON),
                      (te_source.FILES["transformer_engine.pytorch.triton.permutation"], TE_TORCH),
                      ("build_tools/VERSION.txt", "9.9.0\n")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    module, where = te_source._from_source(str(tmp_path))
    assert module.permute_with_mask_map() == "kernel" and where == "TransformerEngine 9.9.0 from source"
    assert not any(n == "transformer_engine" or n.startswith("transformer_engine.") for n in sys.modules)
    with pytest.raises(ImportError, match="is no TransformerEngine checkout: .*pytorch/triton/permutation.py"):
        (tmp_path / te_source.FILES["transformer_engine.pytorch.triton.permutation"]).unlink()
        te_source._from_source(str(tmp_path))
    with pytest.raises(ImportError, match="set MOEBENCH_TE_SOURCE"):
        te_source._from_source(None)


def test_te_without_a_gpu_is_waived_with_why(tmp_path):
    out = tmp_path / "p.jsonl"
    assert permute.main(["--ops-impl", "torch,te", "--shapes", "16x32x2x4", "--iters", "1", "--out", str(out)]) == 0
    te = [json.loads(line) for line in out.read_text().splitlines() if '"impl": "te"' in line]
    assert te and {r["check"]["status"] for r in te} == {"WAIVED"}
    assert all("CUDA" in r["check"]["error"] or "transformer_engine" in r["check"]["error"] for r in te)
