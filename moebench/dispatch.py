"""python -m moebench.dispatch: time isolated dispatch and combine for each backend, after a
correctness check, on identical routing; report GB/s under one byte rule against link ceilings.

Without a GPU (or with --device cpu) it runs on CPU/gloo: a functional run, not a measurement.
"""
from __future__ import annotations

import argparse
import sys

from . import cli
from .core.workload import WorkloadError
from .env import launcher
from .env.limits import open_files_problem
from .harness import spec, sweep
from .harness.launch import is_lead, join_problem
from .harness.runner import run_case
from .harness.spec import RunSpec
from .records import schema, tables, writer


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m moebench.dispatch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    spec.add_args(p)        # the flags of one run (moebench/harness/spec.py)
    sweep.add_args(p)       # --sweep NAME, --knob-sweep, --max-cases, --redo-failed (moebench/harness/sweep.py)
    p.add_argument("--wide", action="store_true",
                   help="the table with every timing view timed, wirebw and long errors (default: api and graph, "
                        "or the views --views names; the JSONL holds everything either way)")
    return p


@cli.tool
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    bad_out = (sweep.modifier_problem(args) or cli.output_problem(args.out, "--out") or launcher.problem()
               or open_files_problem(args.ep))        # a sweep's every case alike: one line, not one per case
    if bad_out:
        cli.error("moebench.dispatch", bad_out)
        return 2
    cli.text_to_stderr(args.out)         # --out /dev/stdout | jq: the pipe carries the records alone
    if args.sweep:
        return sweep.main_sweep(args)
    try:
        run = RunSpec.from_args(args).check()
    except WorkloadError as e:
        cli.error("moebench.dispatch", e)
        return 2
    if not_joined := join_problem(run.timeout_s):
        cli.error("moebench.dispatch", not_joined)
        return 2
    lead = is_lead()
    say = print if lead else (lambda *a, **k: None)          # rank 0 of a job reports and writes
    if run.note:
        say(f"# NOTE: {run.note}")
    w = run.workload
    say(f"# workload: T={w.num_tokens} H={w.hidden} E={w.num_experts} K={w.topk} EP={w.ep} "
        f"dtype={w.dtype} routing={w.routing} seed={w.seed} device={run.device}")
    done: list[str] = []
    written = [0]

    def finished(name: str, recs: list[dict]) -> None:     # each backend's records on disk as it ends
        if lead:
            writer.write_jsonl(args.out, recs)
        if name not in done:
            done.append(name)
        written[0] += len(recs)
    try:
        records = run_case(run, list(sys.argv[1:] if argv is None else argv), progress=say, sink=finished)
    except KeyboardInterrupt as e:
        left = [b for b in run.backends if b not in done]
        cut = (f"not run: {', '.join(left)}" if left else      # every backend's timed records are in: its soak
               f"--repeats {run.repeats} cut short before its last repeat ended" if run.repeats > 1 else
               f"the soak of {done[-1]} cut short" if run.soak else "every backend finished")
        raise cli.Interrupted.after(e, f"{written[0]} records of {', '.join(done) or 'no backend'} kept in "
                                       f"{args.out}; {cut}") from None
    if not lead:
        return 0
    print(tables.format_table(records, run.table_views(args.wide), args.wide))
    print(f"# {len(records)} records appended to {args.out} as each backend finished")
    if run.device == "cpu":
        print("# CPU/gloo run: the times above are functional only, not performance figures")
    elif run.ranks_per_gpu > 1:
        print("# shared-GPU run: ranks time-slice one GPU; the times above are functional only, "
              "not performance figures")
    failed = sorted({schema.name(r) for r in records if schema.status(r) == "FAIL"})
    if failed:
        print(f"# FAIL: {', '.join(failed)}", file=sys.stderr)
    return schema.exit_code(records)


if __name__ == "__main__":
    sys.exit(cli.run(main, "moebench.dispatch"))
