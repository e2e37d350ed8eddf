"""Build-kind detection on small shared objects compiled here (gcc)."""
import shutil
import subprocess

import pytest

from moebench.env import buildkind

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _cc(tmp_path, name, src, *flags):
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c), *flags], check=True, capture_output=True)
    return out


@pytest.fixture
def libs(tmp_path):
    intra = _cc(tmp_path, "hybrid_ep_cpp_intra", 'const char *msg(void) { return "Inter-node communication is '
                'not supported. Please rebuild with HYBRID_EP_MULTINODE flag, group_size=%d"; }\n')
    _cc(tmp_path, "libibverbs", "int ibv_stub(void) { return 0; }\n", "-Wl,-soname,libibverbs.so.1")
    _cc(tmp_path, "libmlx5", "int mlx5_stub(void) { return 0; }\n", "-Wl,-soname,libmlx5.so.1")
    multi = _cc(tmp_path, "hybrid_ep_cpp_multi", "int ibv_stub(void); int f(void) { return ibv_stub(); }\n",
                f"-L{tmp_path}", "-Wl,--no-as-needed", "-libverbs", "-lmlx5")
    plain = _cc(tmp_path, "plain", "int g(void) { return 1; }\n")
    both = _cc(tmp_path, "both", 'const char *m(void) { return "Multi-node support is not enabled in this build."; }\n',
               f"-L{tmp_path}", "-Wl,--no-as-needed", "-libverbs")
    return {"intra": intra, "multi": multi, "plain": plain, "both": both}


def test_needed_list_matches_readelf(libs):
    needed = buildkind.elf_needed(libs["multi"])
    assert "libibverbs.so.1" in needed and "libmlx5.so.1" in needed
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", str(libs["multi"])], capture_output=True, text=True).stdout
        want = [ln.split("[")[1].split("]")[0] for ln in out.splitlines() if "(NEEDED)" in ln]
        assert needed == want


def test_kinds(libs):
    assert buildkind.hybridep_build_kind(libs["intra"]).kind == "intranode"
    m = buildkind.hybridep_build_kind(libs["multi"])
    assert m.kind == "multinode" and m.transport.startswith("DOCA") and "libibverbs.so.1" in m.evidence
    assert buildkind.hybridep_build_kind(libs["plain"]).kind == "unknown"
    assert "conflicting" in buildkind.hybridep_build_kind(libs["both"]).evidence


def test_not_elf(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"not an elf at all")
    with pytest.raises(buildkind.ELFError):
        buildkind.elf_needed(p)


def test_extension_path_does_not_import(tmp_path, monkeypatch):
    (tmp_path / "fake_ext_mod.py").write_text("raise SystemExit('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert buildkind.extension_path("fake_ext_mod").endswith("fake_ext_mod.py")
    assert buildkind.extension_path("surely_not_a_module_xyz") is None
