"""bench/device_round.sh, the one command of a device round, on CPU: its bad input is one line and exit 2 before any
work; its steps run in order within their shares of the budget, a step the budget ends is `cut`, one that fails or
outruns its own limit FAIL, each with one summary line; every step's files come back in one bundle. And the GPU
tier's order for xdist workers (conftest.slow_first)."""
import os
import subprocess
import tarfile
from types import SimpleNamespace

import pytest

from conftest import ROOT, slow_first

SCRIPT = ROOT / "bench" / "device_round.sh"


def round_(tmp_path, *args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": str(ROOT), **env})


@pytest.mark.parametrize("args, says", [
    ((), "name at least one step"), (("tier", "--budget", "0"), "--budget wants whole seconds"),
    (("--budget", "9x", "tier"), "--budget wants whole seconds"), (("tier", "nope"), "unknown step 'nope'"),
    (("tier:abc",), "a step's share is whole seconds")])
def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, args, says):
    r = round_(tmp_path, *args)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_list_names_every_step():
    r = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, timeout=30)
    steps = [line.split()[0] for line in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr
    assert steps[:9] == ["tier", "fp8q", "ep1", "ab", "ep1fp8", "chained", "sms", "soak", "permute"], r.stdout


EXTRA = """ABOUT[ok]="writes a file"; ABOUT[slow]="sleeps past its share"; ABOUT[bad]="outruns its own limit"
ORDER+=(ok slow bad)
step_ok() { t 30 sh -c "echo hi > $D/hello.txt"; }
step_slow() { t 60 sleep 30; t 5 true; }
step_bad() { t 1 sleep 3; t 1 sleep 3; }
"""


def test_steps_run_within_their_shares_with_one_summary_line_each(tmp_path):
    extra = tmp_path / "extra.sh"
    extra.write_text(EXTRA)
    r = round_(tmp_path, "--budget", "100", "ok", "slow:2", "bad", ROUND_EXTRA=str(extra), MIN_LEFT="1",
               RESERVE="1", MOEBENCH_GIT_SHA="abc1234")
    out = tmp_path / "out"
    lines = (out / "summary.txt").read_text().splitlines()
    assert lines[0].startswith("# device round at abc1234") and "budget 100 s" in lines[0], lines
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["ok"].split()[1] == "PASS" and rows["ok"].split()[4] == "ok/hello.txt", rows
    assert rows["slow"].split()[1] == "cut" and "its share ended: sleep 30; not run: true" in rows["slow"], rows
    assert rows["bad"].split()[1] == "FAIL" and "outran its 1 s: sleep 3 (x2)" in rows["bad"], rows
    assert int(rows["slow"].split()[2]) < 5 and list(rows) == ["setup", "ok", "slow", "bad"]
    assert sorted(os.listdir(out)) == ["results.tgz", "round.log", "summary.txt"]
    with tarfile.open(out / "results.tgz") as tar:
        assert tar.extractfile("./ok/hello.txt").read() == b"hi\n"
    assert "### slow" in (out / "round.log").read_text() and r.returncode == 0


def test_slow_tests_lead_and_each_takes_one_quick_one_along():
    item = lambda name, slow: SimpleNamespace(name=name, keywords={"slow": 1} if slow else {})  # noqa: E731
    items = [item("q1", False), item("s1", True), item("q2", False), item("s2", True), item("q3", False),
             item("q4", False), item("s3", True)]
    assert [i.name for i in slow_first(items)] == ["s1", "q1", "s2", "q2", "s3", "q3", "q4"]
    assert [i.name for i in slow_first(items[:1])] == ["q1"]
