"""moebench.env.toolkit.find_nvcc: the one nvcc lookup, in its documented order."""
from __future__ import annotations

from moebench.env import toolkit


def _nvcc(root):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("")
    return str(root / "bin" / "nvcc")


def test_find_nvcc_order(monkeypatch, tmp_path):
    home, path_dir, default = _nvcc(tmp_path / "home"), _nvcc(tmp_path / "cp"), _nvcc(tmp_path / "dflt")
    (tmp_path / "onpath").mkdir()
    on_path = tmp_path / "onpath" / "nvcc"
    on_path.write_text("")
    on_path.chmod(0o755)
    monkeypatch.setattr(toolkit, "DEFAULT_HOMES", (str(tmp_path / "dflt"),))
    monkeypatch.setenv("PATH", str(tmp_path / "onpath"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cp"))
    assert toolkit.find_nvcc() == home
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "missing"))      # set but without bin/nvcc
    assert toolkit.find_nvcc() == path_dir
    monkeypatch.delenv("CUDA_PATH")
    assert toolkit.find_nvcc() == str(on_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert toolkit.find_nvcc() == default
    monkeypatch.setattr(toolkit, "DEFAULT_HOMES", ())
    assert toolkit.find_nvcc() is None
