"""python -m moebench.check: bring-up and container acceptance before a training run.

Each check is PASS, FAIL or WAIVED (cannot run here; the reason says why). Probes of DeepEP,
HybridEP, NCCL, NVSHMEM and the p2p CUDA probe run in child processes with a timeout: a segfault,
an abort or a hang is a FAIL row naming the signal, and the run goes on. Exit status: 0 when
nothing FAILed, 1 when something did, 2 on bad usage.

  python -m moebench.check -l                      list the checks
  python -m moebench.check -p hybridep             the HybridEP family
  python -m moebench.check --out out.json --junit out.xml --baseline old.json
"""
from __future__ import annotations

import argparse
import sys

from . import checks, cli
from .checks import baseline, output
from .checks.registry import FAIL, REGISTRY, Context, SelectionError
from .env import launcher
from .env.limits import open_files_problem
from .harness.spec import add_shape_args
from .records import provenance, tables
from .records.reader import RecordError


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m moebench.check", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-l", "--list", action="store_true", help="list the checks and exit")
    p.add_argument("-t", "--test", action="append", metavar="KEY", help="run check KEY (or family KEY.*); repeatable")
    p.add_argument("-p", "--prefix", action="append", metavar="PREFIX", help="run checks whose key starts with PREFIX")
    p.add_argument("--out", metavar="PATH", help="write the report as one JSON object (replaced each run)")
    p.add_argument("--json", dest="out", default=argparse.SUPPRESS, help=argparse.SUPPRESS)   # old name of --out
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML (WAIVED = skipped, FAIL = failure)")
    p.add_argument("--baseline", metavar="FILE", help="earlier run (dispatch JSONL or check --out report) to gate against")
    p.add_argument("--threshold", type=cli.number(0), default=baseline.DEFAULT_THRESHOLD_PCT,
                   help="bandwidth drop in %% that fails the baseline gate (default 10)")
    p.add_argument("--results", action="append", metavar="FILE",
                   help="also gate these moebench.dispatch JSONL results against --baseline")
    p.add_argument("--ep", type=cli.count(), help="EP size the training run will use (hybridep.domain; default: visible GPUs)")
    p.add_argument("--tp", type=cli.count(), default=1, help="TP size of the training run (EP x TP vs the NVLink domain)")
    add_shape_args(p, tokens_help="round-trip tokens per rank")
    p.add_argument("--ll-num-tokens", type=cli.count(), default=128, help="round-trip tokens per rank for deepep-ll")
    p.add_argument("--iters", type=cli.count(high=cli.MAX_ITERS), default=10, help="timed iterations of the round trips")
    p.add_argument("--soak", type=cli.count(0, cli.MAX_CALLS), default=0, metavar="N",
                   help="after each round trip, N more calls on fresh routing (and N graph replays), each checked "
                        "against the oracle: a build that corrupts a few percent of calls FAILs (default 0: off)")
    p.add_argument("--timeout", type=cli.seconds, default=300.0, help="seconds per contained probe")
    p.add_argument("--watchdog", type=cli.seconds, default=60.0,
                   help="fault.*: seconds the other ranks have after the fault to end on their own before moebench "
                        "ends them (their process group's timeout: half of it; default 60)")
    p.add_argument("--wide", action="store_true", help="whole summaries on the terminal (default: cut to fit 160 columns)")
    p.add_argument("--sysfs-root", default="/sys", help=argparse.SUPPRESS)     # fake trees in tests
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    return p


def _size_problem(args) -> str:
    """The round trips' shape past this machine's memory (preflight), before any probe starts: '' or why."""
    from .core.workload import Workload, WorkloadError
    from .harness import preflight
    from .harness.placement import for_roundtrip, visible_gpus
    try:
        w = Workload(num_tokens=max(args.num_tokens, args.ll_num_tokens), hidden=args.hidden,
                     num_experts=args.num_experts, topk=args.topk, ep=1)
    except WorkloadError as e:
        return str(e)
    return preflight.inputs_problem(w, for_roundtrip(visible_gpus()).ranks)


def _validate(args) -> None:
    bad_out = (cli.first_output_problem([(args.out, "--out"), (args.junit, "--junit")]) or launcher.problem()
               or open_files_problem(2))     # the round trips' ranks
    if bad_out or (bad_out := _size_problem(args)):
        raise SelectionError(bad_out)
    if args.results and not args.baseline:
        raise SelectionError("--results needs --baseline: the results are gated against it")
    for flag, f in [("--baseline", args.baseline), *(("--results", f) for f in args.results or [])]:
        if f:
            try:
                rows = baseline.read_rows(f)
            except RecordError as e:
                raise SelectionError(f"{flag} {e}") from None
            if not rows:
                raise SelectionError(f"{f}: no bandwidth rows in it (a timed PASS moebench.dispatch record, a rows "
                                     "JSONL or a moebench.check --out report with rows): nothing to gate against")


WIDTH = 160    # the terminal lines fit it unless --wide; --out and --junit keep every summary whole


def _line(r, wide: bool = False) -> str:
    head = f"{r.status:<7} {r.key:<22} {r.seconds:7.1f}s  "
    return head + (r.summary if wide else tables.shorten(r.summary, WIDTH - len(head)))


@cli.tool
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.list:
        for c in REGISTRY.values():
            text = f"{c.key:<20} {c.description}"
            print(text if args.wide else tables.shorten(text, WIDTH))
        return 0
    try:
        _validate(args)
        chosen = checks.select(args.test, args.prefix)
    except SelectionError as e:
        cli.error("moebench.check", e)
        return 2
    cli.text_to_stderr(args.out, args.junit)
    start = provenance.utc_now()
    print(f"# moebench.check: {len(chosen)} check(s)")
    res = checks.run(chosen, Context(args), progress=lambda r: print(_line(r, args.wide), flush=True))
    c = output.counts(res)
    cut = not args.wide and any(len(_line(r, True)) > WIDTH for r in res)
    print(f"# {c['PASS']} PASS, {c['FAIL']} FAIL, {c['WAIVED']} WAIVED"
          + ("; reasons cut at a word: --wide or --out FILE has them whole" if cut else ""))
    if args.out:
        output.write_json(args.out, output.to_json(res, argv, start, provenance.utc_now()))
    if args.junit:
        output.write_junit(args.junit, res)
    return 1 if any(r.status == FAIL for r in res) else 0


if __name__ == "__main__":
    sys.exit(cli.run(main, "moebench.check"))
