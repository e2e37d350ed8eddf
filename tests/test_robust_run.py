"""Issue 13, the run itself: backends that cannot take a shape, dying with the parent, signals."""
import os
import subprocess
import sys
from pathlib import Path

from moebench.record import read as read_records

FAKES = Path(__file__).parent / "fakes"
ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--num-experts", "8", "--topk", "2",
         "--iters", "1"]


def fake_env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": f"{FAKES}{os.pathsep}{ROOT}", **extra}


def test_backend_all_waives_what_cannot_take_the_shape(tmp_path):
    """deep_ep importable (the fake), --hidden 100: deepep and deepep-ll are WAIVED with the reason, exit 0."""
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "moebench.dispatch", *SMALL, "--hidden", "100", "--backend", "all",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=fake_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    recs = {r["backend"]["name"]: r for r in read_records(out)}
    for name in ("deepep", "deepep-ll", "hybridep"):
        assert recs[name]["check"]["status"] == "WAIVED", recs[name]["check"]
        assert "--hidden" in recs[name]["check"]["error"]
    assert recs["alltoall"]["check"]["status"] == "PASS"
