"""The DeepEP build named everywhere: build_info read from a fake installed build made of small
shared objects compiled here, the records' env, the check's env row, and deepep.ll-roundtrip WAIVED
(saying why) only for a build without NVSHMEM."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="needs gcc, g++")
SUFFIX = ".cpython-311-x86_64-linux-gnu.so"


def _so(out: Path, src: str, cc: str = "gcc", *flags: str) -> Path:
    c = out.with_suffix(".c" if cc == "gcc" else ".cpp")
    c.write_text(src)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(c), *flags], check=True, capture_output=True)
    c.unlink()
    return out


def fake_build(root: Path, nvshmem: bool, shared_libstdcxx: bool) -> Path:
    """A build as bench/deepep_build.sh leaves it: deep_ep/, the two extensions, deepep_build.json."""
    root.mkdir(parents=True)
    (root / "deep_ep").mkdir()
    (root / "deep_ep" / "__init__.py").write_text("")
    if nvshmem:
        _so(root / "libnvshmem_host.so.3", "int nvshmem_stub(void) { return 0; }\n", "gcc",
            "-Wl,-soname,libnvshmem_host.so.3")
        _so(root / f"deep_ep_cpp{SUFFIX}", "int nvshmem_stub(void); int f(void) { return nvshmem_stub(); }\n", "gcc",
            f"-L{root}", "-Wl,--no-as-needed", "-l:libnvshmem_host.so.3")
    else:
        _so(root / f"deep_ep_cpp{SUFFIX}", 'const char *m(void) { return "false and \\"NVSHMEM is disable during '
            'compilation\\""; }\n')
    intra = 'const char *m(void) { return "Please rebuild with HYBRID_EP_MULTINODE flag"; }\n'
    if shared_libstdcxx:
        _so(root / f"hybrid_ep_cpp{SUFFIX}", '#include <string>\nextern "C" const char *m() { static std::string s = '
            '"Please rebuild with HYBRID_EP_MULTINODE flag"; return s.c_str(); }\n', "g++")
    else:
        _so(root / f"hybrid_ep_cpp{SUFFIX}", intra)
    (root / "deepep_build.json").write_text(json.dumps({"version": "1.2.1", "commit": "94a9f8f6b146c07d97ec58f67cd6d30"
                                                        "3296d6098", "fix": "x", "branch": "hybrid-ep"}))
    return root


def run(code: str, build: Path) -> str:
    env = {**os.environ, "PYTHONPATH": f"{build}{os.pathsep}{ROOT}", "LD_LIBRARY_PATH": str(build)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=build)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


INFO = "import json; from moebench.env.deepep import build_info; print(json.dumps(build_info()))"


@pytest.mark.parametrize("nvshmem, shared", [(True, True), (False, False)])
def test_build_info_names_the_build(tmp_path, nvshmem, shared):
    info = json.loads(run(INFO, fake_build(tmp_path / "b", nvshmem, shared)))
    assert info["version"] == "1.2.1" and info["commit"].startswith("94a9f8f")
    assert info["nvshmem"] is nvshmem and info["hybridep_build"] == "intranode"
    assert info["extensions"]["deep_ep_cpp"] and info["extensions"]["hybrid_ep_cpp"]
    assert info["hybridep_libstdcxx"].startswith("shared" if shared else "static")
    s = info["summary"]
    assert s.startswith("1.2.1 @94a9f8f6b1") and ("NVSHMEM" in s) and ("no NVSHMEM" in s) != nvshmem
    assert ("libstdc++ shared" if shared else "libstdc++ static") in s


def test_every_record_names_the_build_never_null(tmp_path):
    out = run("import json; from moebench.records.provenance import provenance; p = provenance(); "
              "print(json.dumps([p['deep_ep'], p['deep_ep_build']['nvshmem']]))", fake_build(tmp_path / "b", True, True))
    summary, nvshmem = json.loads(out)
    assert summary and "1.2.1" in summary and nvshmem is True


@pytest.mark.slow
def test_ll_roundtrip_is_waived_only_for_a_build_without_nvshmem(tmp_path):
    code = ("from moebench.check import main; import sys; sys.exit(main(['-t', 'deepep.ll-roundtrip', '-t', 'env', "
            "'--out', 'c.json']))")
    b = fake_build(tmp_path / "b", False, True)
    run(code, b)
    rows = {r["key"]: r for r in json.loads((b / "c.json").read_text())["results"]}
    ll = rows["deepep.ll-roundtrip"]
    assert ll["status"] == "WAIVED" and "has no NVSHMEM" in ll["summary"] and "FIX=nvshmem" in ll["summary"]
    assert "no NVSHMEM" in rows["env"]["summary"] and rows["env"]["details"]["versions"]["deep_ep_build"]["commit"]
