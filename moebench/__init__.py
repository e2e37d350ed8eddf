"""moebench: MoE expert-parallel dispatch/combine benchmark and acceptance suite.

Shape-suffixed names follow one legend: T tokens per rank, H hidden, E experts, K top-k,
R received (or permuted) rows, L local experts, W world (EP) size.
"""

__version__ = "0.1.0"
