"""What every `python -m moebench.<tool>` shares at its edges, one module per concern:

- edges.py: exit codes, interrupts (SIGINT / SIGTERM: one line, 130 / 143, also while importing) and stdout
  (a closed pipe drops the output, not the work: 141; an unusable one at the start is bad usage).
- values.py: bad input is one line on stderr and exit 2: `Parser` and the argument types, which
  range-check every value as it is parsed.
- paths.py: output paths checked before any work (an empty path, a directory, a path under a file, an
  unwritable place, a FIFO or a full device is refused; missing folders are made; two flags naming one
  file are refused), and input files named twice.
- settings.py: a setting is one dataclass field whose metadata makes its flag.
Tools use them through this package (`cli.count()`, `cli.run(...)`).
"""
from .edges import (EXIT_BROKEN_PIPE, EXIT_USAGE, TOOLS, Interrupted, OutputError, error,  # noqa: F401
                    interrupts_at_start, one_line, run, stdout_problem, text_to_stderr, tool)
from .paths import first_output_problem, held_open, output_problem, real_path, repeated_input  # noqa: F401
from .settings import add_settings, read_settings, setting, write_settings  # noqa: F401
from .values import (MAX_CALLS, MAX_ITERS, MAX_WAIT_S, SEED_MAX, Parser, comma_list, count, number,  # noqa: F401
                     own_empty, seconds, seed)
