"""env/te.py: whether Transformer Engine can serve megatron-core 0.19's ncclep, read from its files: the version
0.19 calls (2.18), its pytorch/ep.py, and an extension built with NCCL EP (ep.py ships without it)."""
import pytest

from moebench.env.te import te_nccl_ep_problem


def fake_te(root, version="2.18.0", ep_py=True, binding=True):
    pkg = root / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    if ep_py:
        (pkg / "pytorch" / "ep.py").write_text("")
    meta = root / f"transformer_engine-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformer_engine\nVersion: {version}\n")
    (root / "transformer_engine_torch.so").write_bytes(b"\x7fELF..." + (b"ep_initialize\0" if binding else b"gemm\0"))


@pytest.mark.parametrize("kw, want", [
    ({}, ""),
    ({"binding": False}, "built without NCCL EP"),
    ({"version": "2.17.1"}, "is 2.17.1; megatron-core 0.19's ncclep path calls TE 2.18 exactly"),
    ({"version": "2.19.0"}, "is 2.19.0"),
    ({"ep_py": False}, "has no pytorch/ep.py"),
])
def test_te_for_ncclep_needs_2_18_with_its_nccl_ep_bindings_built(tmp_path, monkeypatch, kw, want):
    fake_te(tmp_path, **kw)
    monkeypatch.syspath_prepend(str(tmp_path))
    why = te_nccl_ep_problem()
    assert (why == "") if not want else (want in why), why

