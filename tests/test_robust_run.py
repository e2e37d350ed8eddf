"""Issue 13, the run itself: backends that cannot take a shape, dying with the parent, signals."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from procs import alive, children_of, wait_for

from moebench.records.schema import read as read_records

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


NAP = """
import sys, time
from moebench.harness.launch import run_ranks

def nap(ctx):
    time.sleep(120)

if __name__ == "__main__":
    run_ranks(nap, 2, "cpu", 300.0)
"""


def test_ranks_die_with_a_sigkilled_parent(tmp_path):
    script = tmp_path / "nap.py"
    script.write_text(NAP)
    p = subprocess.Popen([sys.executable, str(script)], env=fake_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        kids = wait_for(lambda: (lambda k: k if len(k) >= 3 else None)(children_of(p.pid)), 60)  # 2 ranks + tracker
        assert kids and len(kids) >= 3, children_of(p.pid)
        time.sleep(1.0)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_for(lambda: not any(alive(k) for k in kids), 20), [k for k in kids if alive(k)]
    finally:
        for k in children_of(p.pid):
            os.kill(k, signal.SIGKILL)


def test_sigterm_ends_a_run_with_one_line_and_no_orphans(tmp_path):
    p = subprocess.Popen([sys.executable, "-u", "-m", "moebench.dispatch", *SMALL[:-2], "--iters", "1000000",
                          "--hidden", "64", "--backend", "alltoall", "--out", str(tmp_path / "r.jsonl")],
                         env=fake_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kids = wait_for(lambda: (lambda k: k if len(k) >= 2 else None)(children_of(p.pid)), 60)
    assert kids, "no rank processes started"
    time.sleep(3.0)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err[-2000:]                   # 128 + SIGTERM
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == [f"moebench.dispatch: interrupted by SIGTERM; 0 records of no backend kept in "
                                        f"{tmp_path / 'r.jsonl'}; not run: alltoall"], err
    assert wait_for(lambda: not any(alive(k) for k in kids), 20)
