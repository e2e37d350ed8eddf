"""Megatron handoff (`python -m moebench.megatron`): the flags for the winner of a matched A/B
(flags.py), and a short real megatron-core training check of a dispatcher (train.py); tool.py is
the command line. Megatron's names for moebench's backends are in core/megatron_map.py."""
from .tool import main, parser

__all__ = ["main", "parser"]
