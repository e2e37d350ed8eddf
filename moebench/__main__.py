"""python -m moebench: the tools, one line each (each is `python -m moebench.<tool> --help`);
`python -m moebench TOOL ARGS...` runs that tool, and a name that is no tool is refused with the list."""
from __future__ import annotations

import importlib
import sys

from . import cli

TOOLS = (
    ("dispatch", "dispatch/combine per backend: table + JSONL (the main job)"),
    ("permute", "moebench's permute/unpermute kernels (torch, Triton, CUDA) vs Megatron-Core"),
    ("check", "bring-up and container acceptance: PASS / FAIL / WAIVED, JSON and JUnit"),
    ("megatron", "Megatron flags for the winner, and a short megatron-core training check (validate: GPU)"),
    ("report", "tables, plots, A/B verdicts from JSONL"),
    ("plan", "what EP N would cost on a given cluster shape"),
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("-h", "--help"):
        names = [name for name, _ in TOOLS]
        if argv[0] not in names:
            print(f"moebench: error: unknown tool {argv[0]!r} (known: {', '.join(names)}; "
                  "python -m moebench.<tool> --help for each)", file=sys.stderr)
            return cli.EXIT_USAGE
        return importlib.import_module(f"moebench.{argv[0]}").main(argv[1:])
    print("moebench tools (python -m moebench.<tool> --help for each):")
    for name, what in TOOLS:
        print(f"  python -m moebench.{name:<9} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main, "moebench"))
