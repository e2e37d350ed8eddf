"""Issue 13, first contact: the default output is documented, `python -m moebench` lists the tools,
`megatron validate` says it needs a GPU and offers --device cpu as a functional check, README's examples
say which need GPUs."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moebench import dispatch, megatron
from moebench.env.toolkit import installed

ROOT = Path(__file__).resolve().parent.parent


def test_default_output_is_in_help_and_readme():
    assert "default:./moebench-dispatch.jsonl" in "".join(dispatch.parser().format_help().split())
    assert "default `./moebench-dispatch.jsonl`" in " ".join((ROOT / "README.md").read_text().split())


def test_python_m_moebench_lists_every_tool():
    p = subprocess.run([sys.executable, "-m", "moebench"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    for tool in ("dispatch", "permute", "check", "megatron", "report", "plan"):
        assert f"python -m moebench.{tool}" in p.stdout
        assert (ROOT / "moebench" / f"{tool}.py").is_file() or (ROOT / "moebench" / tool / "__main__.py").is_file()


def test_megatron_validate_offers_device_cpu_and_says_it_needs_a_gpu(capsys):
    assert megatron.main(["validate", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--device {auto,cuda,cpu}" in help_text and "needs GPUs" in help_text and "not a validation" in help_text
    with pytest.raises(SystemExit):
        megatron.parser().parse_args(["validate", "--dispatcher", "alltoall", "--cpu-functional"])
    capsys.readouterr()
    assert megatron.main(["validate", "--dispatcher", "hybridep", "--device", "cpu", "--ep", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("alltoall only" in err[0] if installed("megatron.core") else "megatron-core" in err[0])
    if not torch.cuda.is_available() and installed("megatron.core"):
        assert megatron.main(["validate", "--dispatcher", "alltoall"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs CUDA" in err[0] and "--device cpu" in err[0], err


def test_readme_examples_say_which_need_gpus():
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    blocks = text.split("```bash\n")[1:]
    commands = [line for b in blocks for line in b.split("```")[0].splitlines()
                if "python -m moebench" in line or line.startswith("torchrun")]
    assert len(commands) >= 15
    for line in commands:
        comment = line.partition("#")[2]
        assert "GPU" in comment or "anywhere" in comment, line
