"""Megatron handoff (`python -m moebench.megatron`), in two rooms beside what they share.

tool.py    the command line: one cmd_* function per verb (flags, validate, arm, compare)
flags.py   Megatron's settings for a dispatcher (one lookup); ab.py: the winner of a matched A/B and its flags
patches.py what Megatron needs patched to train here (no Transformer Engine; ranks sharing a GPU)
lm/        validation by Megatron-LM's own pretrain_gpt.py: arguments, plan, one rank, one arm, the log reader,
           the verdict, and the validate / arm / compare commands
quick/     the built-in megatron-core loop (`validate --quick`, or where no Megatron-LM is at hand)

Megatron's names for moebench's backends are in core/megatron_map.py.
"""
from .tool import main, parser

__all__ = ["main", "parser"]
