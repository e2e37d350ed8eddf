"""bench/upstream_compare.py on logs written the way DeepEP's and HybridEP's tests print them
(format strings of hybrid-ep 94a9f8f tests/test_intranode.py and tests/test_hybrid_ep.py)."""
import importlib.util
import json

from conftest import ROOT

spec = importlib.util.spec_from_file_location("upstream_compare", ROOT / "bench" / "upstream_compare.py")
uc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uc)

INTRANODE = """[config] num_tokens=4096, hidden=7168, num_topk=8
[tuning] SMs 24, NVL chunk 4: 100.00 GB/s (NVL), 500.00 us
[tuning] SMs 24, NVL chunk default: 150.00 GB/s (NVL), 300.00 us
[tuning] Best dispatch (FP8): SMs 24, NVL chunk 20, 160.00 GB/s (NVL), t: 290.00 us

[tuning] SMs 24, NVL chunk default: 150.00 GB/s (NVL), 560.50 us
[tuning] Best dispatch (BF16): SMs 24, NVL chunk 20, 160.00 GB/s (NVL), t: 550.00 us

[tuning] SMs 24, NVL chunk default: 150.00 GB/s (NVL), 160.00 us
[tuning] Best dispatch (NVFP4): SMs 24, NVL chunk 20, 160.00 GB/s (NVL), t: 150.00 us

[tuning] SMs 24, NVL chunk 1: 50.00 GB/s (NVL), 900.00 us
[tuning] SMs 24, NVL chunk default: 150.00 GB/s (NVL), 600.00 us
[tuning] Best combine: SMs 24, NVL chunk 6: 160.00 GB/s (NVL), t: 590.00 us
"""

HYBRID = "\n".join([
    "=== Torch API Benchmark (BF16, 8 ranks) ===",
    f"{'dispatch (BF16):'.ljust(48)} 400.00 GB/s (NVL), t: 200.0 us [min=190.0, max=210.0], nvl_recv_bytes: 58.72 MB",
    f"{'combine:'.ljust(48)} 400.00 GB/s (NVL), t: 210.0 us [min=200.0, max=220.0], combine_send_bytes: 58.72 MB",
    f"{'dispatch+permute (BF16):'.ljust(48)} 400.00 GB/s (NVL), t: 250.0 us [min=240.0, max=260.0], nvl_recv_bytes: 58.72 MB",
    f"{'combine+unpermute:'.ljust(48)} 400.00 GB/s (NVL), t: 260.0 us [min=250.0, max=270.0], combine_send_bytes: 58.72 MB",
    "=== Kernel Benchmark (BF16, 8 ranks) ===",
    f"{'dispatch kernel (BF16)(NVL):'.ljust(48)} 700.00 GB/s, avg_t=100.0 us [min=90.0, max=110.0]",
    f"{'combine kernel(NVL):'.ljust(48)} 700.00 GB/s, avg_t=120.0 us [min=110.0, max=130.0]",
    f"{'fused dispatch+permute kernel (BF16)(NVL):'.ljust(48)} 700.00 GB/s, avg_t=99.0 us [min=90.0, max=110.0]",
])


def rec(name, phase, dtype, cached, kernel, mode=None):
    return {"backend": {"name": name, "knobs": {"mode": mode} if mode else {}}, "workload": {"dtype": dtype},
            "phase": phase, "check": {"status": "PASS"},
            "views": {"cached": {"mean_us": cached}, "kernel": {"us": kernel} if kernel else {"none": "no"}}}


def test_parsers_read_the_upstream_formats():
    i = uc.parse_intranode(INTRANODE)
    assert i == {("dispatch", "FP8"): 300.0, ("dispatch", "BF16"): 560.5, ("dispatch", "NVFP4"): 160.0,
                 ("combine", None): 600.0}
    h = uc.parse_hybrid_ep(HYBRID)
    assert h[("Torch API", "BF16", "dispatch+permute (BF16)")] == 250.0 and h[("Torch API", "BF16", "combine")] == 210.0
    assert h[("Kernel", "BF16", "dispatch kernel (BF16)")] == 100.0 and h[("Kernel", "BF16", "combine kernel")] == 120.0


def test_compare_pairs_views_with_their_upstream_figure(tmp_path, capsys):
    recs = [rec("deepep", "dispatch", "bf16", 570.0, None), rec("deepep", "combine", "bf16", 660.0, None),
            rec("hybridep", "dispatch", "bf16", 255.0, 101.0, "permute"), rec("hybridep", "combine", "bf16", 259.0, 119.0, "permute")]
    rows = {(r["backend"], r["phase"], r["view"]): r for r in uc.compare(recs, uc.parse_intranode(INTRANODE),
                                                                           uc.parse_hybrid_ep(HYBRID), 0.05)}
    assert rows[("deepep", "dispatch", "cached")]["upstream_us"] == 560.5 and rows[("deepep", "dispatch", "cached")]["within"]
    assert not rows[("deepep", "combine", "cached")]["within"]                     # 660 / 600 = 1.10
    assert rows[("hybridep/permute", "dispatch", "kernel")]["upstream_us"] == 100.0
    assert ("deepep", "dispatch", "kernel") not in rows                           # test_intranode has no kernel figure
    files = {n: tmp_path / n for n in ("i.txt", "h.txt", "r.jsonl")}
    files["i.txt"].write_text(INTRANODE)
    files["h.txt"].write_text(HYBRID)
    files["r.jsonl"].write_text("\n".join(json.dumps(r) for r in recs))
    argv = ["--intranode", str(files["i.txt"]), "--hybrid-ep", str(files["h.txt"]), "--records", str(files["r.jsonl"])]
    assert uc.main(argv) == 1 and "OUTSIDE" in capsys.readouterr().out
    files["r.jsonl"].write_text("\n".join(json.dumps(r) for r in recs if r["phase"] == "dispatch"))
    assert uc.main(argv) == 0 and "# 3/3 figures within 5%" in capsys.readouterr().out
