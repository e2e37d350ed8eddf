"""What Megatron-LM's pretrain_gpt.py is given for one arm of a validation, and the checkout it runs from.

An arm's command is `PATH/pretrain_gpt.py` + the model (a preset, or the user's own arguments) + the
run settings moebench owns (iterations, seed, mock data, logging) + the flags Megatron needs without
Transformer Engine where TE is missing + the launch's own (gloo for shared-GPU ranks) + exactly the
dispatcher flags `megatron flags` prints for that arm. Only the last part differs between arms
(`dispatcher_diff` shows it), so the user's arguments may not carry dispatcher flags themselves.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ...env.toolkit import installed


class LmError(ValueError):
    """Bad input for a Megatron-LM validation: one line, exit 2."""


@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    model: tuple[str, ...]
    batch_per_rank: int             # global batch = batch_per_rank x data-parallel ranks (micro-batch 1)


COMMON = ("--micro-batch-size", "1", "--bf16", "--moe-router-dtype", "fp32", "--lr", "1e-4", "--min-lr", "1e-5",
          "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--clip-grad", "1.0")
PRESETS = {p.name: p for p in (
    Preset("aws-p6", "the AWS P6-B200 dispatcher validation model: 4 layers, hidden 2048, 16 heads, 16 experts "
                     "top-2, expert FFN 1408, sequence 4096, SwiGLU, RMSNorm, RoPE, no biases; 8 sequences per "
                     "rank per step (global batch scaled to the ranks at hand)",
           ("--num-layers", "4", "--hidden-size", "2048", "--num-attention-heads", "16", "--num-experts", "16",
            "--moe-router-topk", "2", "--ffn-hidden-size", "1408", "--moe-ffn-hidden-size", "1408",
            "--seq-length", "4096", "--max-position-embeddings", "4096", "--disable-bias-linear", "--swiglu",
            "--normalization", "RMSNorm", "--position-embedding-type", "rope", *COMMON), 8),
    Preset("dsv3-small", "a small DeepSeek-V3-like model: 4 layers (the first dense), hidden 1024, 8 heads, 32 "
                         "fine-grained experts top-4 with FFN 512 and a shared expert, sigmoid router with expert "
                         "bias and group-limited routing (8 groups, top 4), sequence 1024; 4 sequences per rank",
           ("--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8", "--ffn-hidden-size", "4096",
            "--num-experts", "32", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "512",
            "--moe-shared-expert-intermediate-size", "512", "--moe-layer-freq", "([0]+[1]*3)",
            "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
            "--moe-router-num-groups", "8", "--moe-router-group-topk", "4", "--moe-router-topk-scaling-factor", "2.5",
            "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4",
            "--seq-length", "1024", "--max-position-embeddings", "1024", "--disable-bias-linear", "--swiglu",
            "--normalization", "RMSNorm", "--position-embedding-type", "rope", *COMMON), 4),
)}
# Megatron-LM without Transformer Engine (measured on the H200, FACTS.md): the local layer spec, and the
# fusions the CLI turns on that need TE or apex off (without --no-rope-fusion it stops: "apply_rope_fusion
# is not available. Please install TE >= 1.4").
NO_TE_FLAGS = ("--transformer-impl", "local", "--no-rope-fusion", "--no-gradient-accumulation-fusion",
               "--no-masked-softmax-fusion", "--no-persist-layer-norm")
SHARED_GPU_FLAGS = ("--distributed-backend", "gloo")     # NCCL refuses two ranks on one GPU
# flags moebench sets itself: the dispatcher's (from `megatron flags`) and the run's
OWNED = {"--moe-token-dispatcher-type": "the arm's dispatcher", "--moe-flex-dispatcher-backend": "the arm's dispatcher",
         "--moe-flex-dispatcher-num-sms": "--num-sms", "--moe-deepep-num-sms": "--num-sms",
         "--moe-hybridep-num-sms": "--num-sms", "--overlap-moe-expert-parallel-comm": "--overlap",
         "--delay-wgrad-compute": "--overlap", "--moe-enable-deepep": "the arm's dispatcher",
         "--expert-model-parallel-size": "--ep", "--train-iters": "--iters", "--log-interval": "(1: every iteration)",
         "--seed": "--seed", "--distributed-backend": "(gloo for shared-GPU ranks)"}


def run_flags(iters: int, seed: int, global_batch: int) -> list[str]:
    """The run settings every arm shares: mock data, every iteration logged with its throughput, memory
    reported after the last iteration too, no evaluation."""
    out = ["--train-iters", str(iters), "--seed", str(seed), "--global-batch-size", str(global_batch),
           "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--split", "99,1,0",
           "--log-interval", "1", "--log-throughput", "--log-memory-interval", str(iters),
           "--eval-iters", "0", "--eval-interval", str(iters + 1)]
    if installed("pynvml"):            # Megatron reads device-level memory through NVML
        out.append("--log-device-memory-used")
    return out


def user_args(text: str | None) -> list[str]:
    """--megatron-args: the user's own arguments (a shell-quoted string); dispatcher and run flags moebench
    sets are refused with the option that sets them."""
    args = shlex.split(text or "")
    for a in args:
        flag = a.split("=", 1)[0]
        if flag in OWNED:
            raise LmError(f"--megatron-args may not set {flag}: moebench sets it ({OWNED[flag]}), so that only the "
                          "dispatcher flags differ between arms")
    return args


def model_flags(preset: str | None, extra: list[str]) -> list[str]:
    if preset in (None, "none"):
        if not extra:
            raise LmError("--preset none needs the model in --megatron-args")
        return list(extra)
    return [*PRESETS[preset].model, *extra]


def flag_value(argv: list[str], flag: str) -> str | None:
    """The last value given to `flag` (`--flag V` or `--flag=V`), as argparse keeps it."""
    val = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith(flag + "="):
            val = a.split("=", 1)[1]
    return val


def dispatcher_diff(control: list[str], candidate: list[str]) -> tuple[list[str], list[str]]:
    """(what only the control has, what only the candidate has): tokens of two arms' commands that differ."""
    a, b = set(_pairs(control)), set(_pairs(candidate))
    return [" ".join(p) for p in _pairs(control) if p not in b], [" ".join(p) for p in _pairs(candidate) if p not in a]


def _pairs(argv: list[str]) -> list[tuple[str, ...]]:
    """Flags with their values as units (`--flag value` or a bare `--switch`)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append((argv[i], argv[i + 1]))
            i += 2
        else:
            out.append((argv[i],))
            i += 1
    return out


# ---------------------------------------------------------------- the checkout
@dataclass
class Checkout:
    path: str
    pretrain: str
    version: str | None              # Megatron-LM's megatron/core/package_info.py, or its git branch/tag
    commit: str | None
    has_core: bool                   # PATH/megatron/core exists: it shadows the installed megatron-core
    installed_core: str | None       # the megatron-core distribution installed here
    notes: list[str] = field(default_factory=list)

    @property
    def core_used(self) -> str | None:
        return self.version if self.has_core else self.installed_core


def inspect_checkout(path: str, installed_core: str | None, commit_env: str | None = None,
                     source: str = "--megatron-lm") -> Checkout:
    """The Megatron-LM checkout at `path`; LmError for one that cannot work: no pretrain_gpt.py, or no
    megatron/core of its own and an installed megatron-core of another minor version."""
    root = Path(path).expanduser()
    pre = root / "pretrain_gpt.py"
    if not root.is_dir():
        raise LmError(f"{source} {path}: not a directory (a Megatron-LM checkout holding pretrain_gpt.py)")
    if not pre.is_file():
        raise LmError(f"{source} {path}: no pretrain_gpt.py there (point it at a Megatron-LM checkout)")
    has_core = (root / "megatron" / "core").is_dir()
    ck = Checkout(str(root.resolve()), str(pre.resolve()), _version(root), _commit(root) or commit_env, has_core,
                  installed_core)
    if not (root / "megatron" / "training").is_dir():
        ck.notes.append("no megatron/training in the checkout: pretrain_gpt.py imports it (the wheel's copy is used "
                        "if installed)")
    mm = lambda v: _minor(v) if v else None  # noqa: E731
    if not has_core:
        if installed_core is None:
            raise LmError(f"--megatron-lm {path}: the checkout has no megatron/core and megatron-core is not installed")
        if ck.version and mm(ck.version) != mm(installed_core):
            raise LmError(f"--megatron-lm {path} is Megatron-LM {ck.version}, but the megatron-core it would run with "
                          f"is {installed_core} (the checkout has no megatron/core of its own): they must match")
    elif installed_core and ck.version and ck.version != installed_core:
        ck.notes.append(f"the checkout's megatron/core {ck.version} runs (it comes first on the path); the installed "
                        f"megatron-core {installed_core} is not used")
    if ck.version is None:
        ck.notes.append("Megatron-LM's version could not be read (no megatron/core/package_info.py, no git)")
    return ck


def _minor(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def _version(root: Path) -> str | None:
    info = root / "megatron" / "core" / "package_info.py"
    if info.is_file():
        text = info.read_text(errors="replace")
        parts = [re.search(rf"^{k}\s*=\s*(\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(p.group(1) for p in parts)
    ref = _git(root, "rev-parse", "--abbrev-ref", "HEAD") if (root / ".git").exists() else None
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", ref or "")
    return m.group(1) if m else None


def _commit(root: Path) -> str | None:
    return _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
