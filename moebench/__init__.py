"""moebench: MoE expert-parallel dispatch/combine benchmark and acceptance suite.

Shape-suffixed names follow one legend: T tokens per rank, H hidden, E experts, K top-k,
R received (or permuted) rows, L local experts, W world (EP) size.
"""
import sys as _sys

__version__ = "0.1.0"

if _sys.argv[:1] == ["-m"]:        # `python -m moebench.<tool>` is starting: a Ctrl-C before cli.run is one line
    from .cli import interrupts_at_start as _quiet

    _quiet()
