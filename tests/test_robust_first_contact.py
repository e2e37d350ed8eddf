"""Issue 13, first contact: the default output is documented, `python -m moebench` lists the tools."""
import subprocess
import sys
from pathlib import Path

from moebench import dispatch

ROOT = Path(__file__).resolve().parent.parent


def test_default_output_is_in_help_and_readme():
    assert "default:./moebench-dispatch.jsonl" in "".join(dispatch.parser().format_help().split())
    assert "default\n`./moebench-dispatch.jsonl`" in (ROOT / "README.md").read_text()


def test_python_m_moebench_lists_every_tool():
    p = subprocess.run([sys.executable, "-m", "moebench"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    for tool in ("dispatch", "permute", "check", "megatron", "report", "plan"):
        assert f"python -m moebench.{tool}" in p.stdout
        assert (ROOT / "moebench" / f"{tool}.py").is_file()
