"""python -m moebench: the tools, one line each (each is `python -m moebench.<tool> --help`)."""
from __future__ import annotations

import sys

TOOLS = (
    ("dispatch", "dispatch/combine per backend: table + JSONL (the main job)"),
    ("permute", "moebench's permute/unpermute kernels (torch, Triton, CUDA) vs Megatron-Core"),
    ("check", "bring-up and container acceptance: PASS / FAIL / WAIVED, JSON and JUnit"),
    ("megatron", "Megatron flags for the winner, and a short megatron-core training check (validate: GPU)"),
    ("report", "tables, plots, A/B verdicts from JSONL"),
    ("plan", "what EP N would cost on a given cluster shape"),
)


def main(argv: list[str] | None = None) -> int:
    print("moebench tools (python -m moebench.<tool> --help for each):")
    for name, what in TOOLS:
        print(f"  python -m moebench.{name:<9} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
