"""Crash containment: real crashing / hanging children become FAIL rows, and the run goes on."""
import time

from moebench.checks import child
from moebench.checks.registry import FAIL, PASS, Check, Context, failed, passed, run


def test_value_comes_back():
    r = child.run_code("from moebench.checks.child import emit; print('noise'); emit({'a': [1, 2]})", 60)
    assert r.ok and r.value == {"a": [1, 2]} and r.failure() == ""


def test_abort_is_sigabrt_with_stderr_tail():
    r = child.run_code("import sys, os; print('about to abort', file=sys.stderr, flush=True); os.abort()", 60)
    assert not r.ok and r.signal == "SIGABRT"
    assert "killed by SIGABRT" in r.failure() and "about to abort" in r.stderr


def test_segfault_is_sigsegv():
    r = child.run_code("import ctypes; ctypes.string_at(0)", 60)
    assert not r.ok and r.signal == "SIGSEGV"
    assert "Fatal Python error" in r.stderr_tail()        # faulthandler's report is kept


def test_hang_is_killed_at_the_timeout_with_its_children():
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True); time.sleep(60)")
    t0 = time.monotonic()
    r = child.run_code(code, 2.0)
    assert r.timed_out and not r.ok and time.monotonic() - t0 < 20
    assert "timed out after" in r.failure()
    grandchild = int(r.stdout.split()[0])
    import os
    time.sleep(0.2)
    try:
        os.kill(grandchild, 0)
        alive = open(f"/proc/{grandchild}/stat").read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "the hung child's own child survived the timeout"


def test_exit_code_and_missing_result():
    r = child.run_code("raise SystemExit(3)", 60)
    assert r.returncode == 3 and "exited with code 3" in r.failure()
    r = child.run_code("pass", 60)
    assert r.returncode == 0 and not r.ok and "without a result" in r.failure()


def test_run_function_target():
    r = child.run_function("moebench.env.buildkind:deep_ep_layout", {}, 60)
    assert r.ok and r.value["installed"] in (True, False)


def _crashing_check(ctx):
    r = child.run_code("import ctypes; ctypes.string_at(0)", 30)
    return passed("ok") if r.ok else failed(f"probe {r.failure()}", stderr=r.stderr_tail())


def test_crashing_probe_is_a_fail_row_and_the_run_goes_on():
    checks = [Check("crash", "", _crashing_check), Check("boom", "", lambda ctx: 1 / 0),
              Check("fine", "", lambda ctx: passed("fine"))]
    res = run(checks, Context(options=None))
    assert [r.status for r in res] == [FAIL, FAIL, PASS]
    assert "SIGSEGV" in res[0].summary and "ZeroDivisionError" in res[1].summary


def test_segfault_hint_is_the_crash_site_not_the_module_list():
    r = child.run_code("import json, ctypes\ndef build_buffer():\n    ctypes.string_at(0)\nbuild_buffer()", 60)
    assert r.signal == "SIGSEGV"
    hint = r.failure()
    assert "Extension modules" not in hint and "(total:" not in hint
    assert hint.startswith("killed by SIGSEGV; Segmentation fault at ") and "in build_buffer" in hint


def test_hint_prefers_the_line_the_library_printed_before_dying():
    stderr = ("Inter-node communication is not supported. Please rebuild with HYBRID_EP_MULTINODE flag\n"
              "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
              '  File "/x/hybrid_ep_buffer.py", line 100 in __init__\n\nExtension modules: numpy (total: 1)\n')
    assert child.error_line(stderr).startswith("Inter-node communication is not supported")
    assert child.error_line("warnings\nValueError: bad\n") == "ValueError: bad"
    assert child.error_line("") == ""
