"""python -m moebench.megatron: hand a dispatcher choice to Megatron, and prove it in training.

  flags     Megatron-LM flags, Megatron-Bridge overrides (and its performance harness's form) and env for
            the winner of a matched A/B in a moebench results file (--results FILE, one decision per
            workload), or for a named backend (--backend NAME [--num-sms N]). A candidate replaces alltoall
            only when it beats it by more than the measured noise (moebench/megatron/ab.py).
  validate  Megatron-LM's own pretrain_gpt.py (--megatron-lm PATH, $MEGATRON_LM, or /opt/megatron-lm),
            mock data, once per arm: the alltoall control and each candidate, with exactly the flags
            `flags` prints for it, interleaved and repeated (A B A B); Megatron's log gives time per
            iteration, TFLOP/s/GPU, loss, skipped/NaN iterations and memory; the verdict per candidate is
            KEEP alltoall, SWITCH or INCONCLUSIVE (moebench/megatron/lm/verdict.py). Where no Megatron-LM is
            at hand (or with --quick): the built-in megatron-core loop, a quick check.
  arm       one arm as one rank of your own torchrun/srun job across nodes (one launch per arm);
  compare   the verdict from the arm records of such launches.

Each verb is one cmd_* function here; the Megatron-LM path's work is in lm/, the quick loop's in quick/,
and the A/B and the flags lookup they share in ab.py and flags.py.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from .. import cli
from ..core.megatron_map import BACKENDS, CONTROL
from ..env import launcher
from ..env.limits import open_files_problem
from ..env.toolkit import dist_version
from ..harness.views import SAMPLED as SAMPLED_VIEWS
from ..records.reader import RecordError, read_dispatch
from ..records.repeats import RepeatError
from ..records.schema import FUNCTIONAL_NOTE, performance_only
from . import ab
from . import flags as F
from ..records.megatron import FlagsReport
from .lm.args import PRESETS, LmError

LOOP_MODEL = (("num_layers", cli.count(), ""), ("hidden", cli.count(), ""), ("heads", cli.count(), ""),
              ("ffn_hidden", cli.count(), "expert FFN hidden size"), ("num_experts", cli.count(), ""),
              ("topk", cli.count(), ""), ("seq_length", cli.count(), ""), ("micro_batch", cli.count(), ""),
              ("vocab", cli.count(), ""), ("lr", cli.number(0, strict=True), ""),
              ("aux_loss_coeff", cli.number(0), "0 = no load-balancing loss"))


MIN_GAIN = cli.number(0, high=1)          # a fraction of the control's time: 1 or more no candidate can save
VERSION = re.compile(r"v?\d+\.\d+(\.\d+)*((a|b|rc|\.?post|\.?dev)\d*)*(\+[0-9A-Za-z.]+)?")   # as pip writes it


def core_version(text: str) -> str:
    """argparse type of --megatron-core-version: a version as pip writes it (0.19.2, 0.16.0rc1, v0.19)."""
    if not VERSION.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"must be a megatron-core version such as 0.16.1 or 0.19.2, got {text!r}")
    return text.strip()


def fit_window(args, iters: int, window: int | None) -> None:
    """args.iters and args.window, their defaults filled in (window None: the quick loop's own, train.py), and
    LmError before any work when the steady window (the last N iterations) leaves none to warm up."""
    args.iters = args.iters or iters
    args.window = window if args.window is None else args.window
    if args.window is not None and args.window >= args.iters:
        raise LmError(f"--window {args.window} must be below --iters {args.iters} (the first iterations warm up)")


def dispatcher_list(text: str) -> list[str]:
    try:
        names = cli.comma_list(text, "", "dispatcher")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if any(n not in BACKENDS for n in names):
        raise argparse.ArgumentTypeError(f"must be a list of {', '.join(BACKENDS)}, got {text!r}")
    return names


def _flags_parser(sub) -> None:
    f = sub.add_parser("flags", help="Megatron settings from results or a backend name")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", help="moebench.dispatch JSONL file")
    src.add_argument("--backend", help=" | ".join(BACKENDS) + " (mcore-* accepted)")
    f.add_argument("--num-sms", type=cli.count(), help="SMs for deepep/hybridep (default: from the winning record)")
    f.add_argument("--megatron-core-version", type=core_version,
                   help="target megatron-core (default: the installed one)")
    f.add_argument("--overlap", action="store_true", help="also emit EP comm/compute overlap settings")
    f.add_argument("--ep", type=cli.count(), help="EP of the training run (--backend mode; gates flex and --overlap)")
    f.add_argument("--tp", type=cli.count(), default=1, help="TP of the training run (--backend mode, default 1)")
    f.add_argument("--ranks-per-nvlink-domain", type=cli.count(),
                   help="GPUs per NVLink domain for HybridEP's env (--backend mode)")
    f.add_argument("--capacity-factor", type=cli.number(0, strict=True, high=1e6), default=1.5,
                   help="ncclep: --moe-expert-rank-capacity-factor to emit (default 1.5; NCCL EP traps on overflow)")
    f.add_argument("--min-gain", type=MIN_GAIN, default=0.0,
                   help="also require the gain to exceed this fraction of alltoall's time (default 0)")
    f.add_argument("--view", choices=SAMPLED_VIEWS, default="api",
                   help="timing view of the A/B (default api: what a training step pays without CUDA graphs; graph "
                        "for steps replayed from CUDA graphs); the verdict names it")
    f.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _lm_options(p, arm: bool = False) -> None:
    """What validate and arm share: the checkout, the model, the run, the launch."""
    p.add_argument("--megatron-lm", metavar="PATH", help="Megatron-LM checkout holding pretrain_gpt.py (default: "
                   "$MEGATRON_LM, else /opt/megatron-lm where the container has it)")
    p.add_argument("--preset", choices=(*PRESETS, "none"), default="aws-p6",
                   help="the model: " + "; ".join(f"{k}: {v.about}" for k, v in PRESETS.items())
                   + "; none: the model comes from --megatron-args (default aws-p6)")
    p.add_argument("--megatron-args", metavar="STR", help="your own pretrain_gpt.py arguments, appended after the "
                   "preset (shell-quoted; no dispatcher flags: each arm's come from `megatron flags`)")
    p.add_argument("--iters", "--steps", dest="iters", type=cli.count(2, cli.MAX_ITERS),
                   help="training iterations per launch (default 30 with Megatron-LM, 50 for the quick loop; "
                        ">= 50 for a final run)")
    p.add_argument("--window", type=cli.count(), help="steady window: the last N iterations (default 10; the quick "
                   "loop: 10 or half the iterations, whichever is fewer)")
    p.add_argument("--seed", type=cli.seed, default=1234, help="Megatron's --seed, the same for every arm")
    p.add_argument("--ep", type=cli.count(), help="EP (default: every rank)")
    p.add_argument("--ranks-per-gpu", type=cli.count(), default=1, metavar="N",
                   help="shared-GPU ranks: N ranks per GPU (gloo groups, CUDA IPC on one device), so the flex "
                        "dispatchers train on fewer GPUs; functional only, its times are no measurement")
    p.add_argument("--num-sms", type=cli.count(), help="SMs for deepep/hybridep (in the flags)")
    p.add_argument("--overlap", action="store_true", help="with the EP comm/compute overlap flags, every arm")
    p.add_argument("--ranks-per-nvlink-domain", type=cli.count(), help="HybridEP's NVLINK domain in ranks "
                   "(default: the ranks of one node)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="validate needs GPUs (auto, cuda); cpu runs the arms on CPU/gloo (a stand-in pretrain_gpt.py, "
                        "or the quick loop with alltoall): a functional check, not a validation and not a measurement")
    p.add_argument("--out", default="moebench-megatron.jsonl", help="JSONL file to append the records to")
    if arm:
        p.add_argument("--dispatcher", type=dispatcher_list, required=True, help="this launch's arm: " + ", ".join(BACKENDS))
        p.add_argument("--repeat", type=cli.count(0), default=0, help="which repeat this launch is (default 0)")


def _validate_parser(sub) -> None:
    v = sub.add_parser("validate", help="train the control and the candidates with Megatron-LM, with a verdict")
    src = v.add_mutually_exclusive_group(required=True)
    src.add_argument("--dispatcher", type=dispatcher_list, help="candidate(s), comma-separated: " + ", ".join(BACKENDS))
    src.add_argument("--results", help="moebench.dispatch JSONL: the candidate is the winner of its A/B")
    _lm_options(v)
    v.add_argument("--repeats", type=cli.count(), default=2, help="launches per arm, interleaved (default 2: A B A B)")
    v.add_argument("--min-gain", type=MIN_GAIN, default=0.0,
                   help="SWITCH only when the candidate saves more than this fraction per iteration (default 0)")
    v.add_argument("--loss-rtol", type=cli.number(0, strict=True), default=0.02,
                   help="the candidate's lm loss must match the control's at every iteration within this relative "
                        "tolerance (default 0.02)")
    v.add_argument("--timeout", type=cli.seconds, default=1800.0, help="seconds per launch (default 1800)")
    v.add_argument("--log-dir", help="each launch's full log (default: OUT's name + -logs/)")
    v.add_argument("--quick", action="store_true", help="the built-in megatron-core loop even where Megatron-LM is at hand")
    v.add_argument("--no-control", action="store_true", help="quick loop: skip the alltoall control run")
    for name, kind, what in LOOP_MODEL:
        v.add_argument("--" + name.replace("_", "-"), type=kind, help=f"quick loop only: {what or name}")


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m moebench.megatron", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    _flags_parser(sub)
    _validate_parser(sub)
    a = sub.add_parser("arm", help="one arm as a rank of your torchrun/srun job (then compare)")
    _lm_options(a, arm=True)
    c = sub.add_parser("compare", help="the verdict from arm records (megatron arm / validate)")
    c.add_argument("files", nargs="+", help="JSONL files holding moebench.megatron.arm records")
    c.add_argument("--min-gain", type=MIN_GAIN, default=0.0, help="as for validate")
    c.add_argument("--loss-rtol", type=cli.number(0, strict=True), default=0.02, help="as for validate")
    c.add_argument("--out", help="append the verdict records here")
    return p


def cmd_flags(args, argv=None) -> int:
    version = args.megatron_core_version or dist_version("megatron-core")
    if not version:
        raise F.FlagsError("megatron-core is not installed here: pass --megatron-core-version V")
    F.parse_version(version)
    if args.results:
        try:
            recs = read_dispatch([args.results], "moebench.megatron flags", verdict=True)
        except RecordError as e:
            raise F.FlagsError(f"--results {e}") from None
        if not (recs := performance_only(recs, "megatron flags")):
            raise F.FlagsError(f"every record in {args.results} is {FUNCTIONAL_NOTE}: measure on the target GPUs")
        decisions = ab.decisions_from_results(recs, version, args.overlap, args.num_sms, args.min_gain, args.view,
                                              args.capacity_factor)
    else:
        fs = F.megatron_flags(args.backend, version, args.num_sms, args.overlap, args.ep, args.ranks_per_nvlink_domain,
                              tp=args.tp, capacity_factor=args.capacity_factor)
        decisions = [{"workload": None, "device": None, "family": None, "control": None, "candidates": [],
                      "winner": fs.backend, "winner_record": None, "reason": "requested with --backend",
                      "flags": fs.asdict()}]
    if args.json:
        print(json.dumps(FlagsReport(version, decisions).asdict(), indent=1, default=str))
    else:
        print("\n\n".join(ab.format_decision(d) for d in decisions))
    return 0


def candidates(args) -> list[str]:
    """--dispatcher, or the winner of the A/B in --results."""
    if args.dispatcher:
        return [d for d in args.dispatcher if d != CONTROL]
    version = dist_version("megatron-core") or "0.19.0"
    try:
        recs = performance_only(read_dispatch([args.results], "moebench.megatron validate", verdict=True),
                                "megatron validate")
    except RecordError as e:
        raise F.FlagsError(f"--results {e}") from None
    winners = {d["winner"] for d in ab.decisions_from_results(recs, version)} - {CONTROL}
    if not winners:
        raise F.FlagsError(f"the A/B in {args.results} keeps alltoall: no candidate to validate (name one with "
                           "--dispatcher to train it anyway)")
    return sorted(winners)


def cmd_validate(args, argv) -> int:
    from .lm import plan as lm_plan
    bad_out = cli.first_output_problem([(args.out, "--out"), (args.log_dir, "--log-dir", True)])
    if bad_out:
        raise F.FlagsError(bad_out)
    cli.text_to_stderr(args.out)
    args.checkout_from = lm_plan.checkout_source(args.megatron_lm)
    found = None if args.quick else lm_plan.find_checkout(args.megatron_lm)
    cands = candidates(args)
    if found is None:
        from .quick.loop import cmd_quick
        if args.results or len(args.dispatcher) != 1:
            raise F.FlagsError("the quick loop takes one --dispatcher (Megatron-LM validates several: --megatron-lm PATH)")
        from .quick.train import TrainSpec
        fit_window(args, TrainSpec.steps, None)
        return cmd_quick(args, argv, args.dispatcher[0])
    given = [n for n, _, _ in LOOP_MODEL if getattr(args, n) is not None]
    if given:
        raise F.FlagsError(f"--{given[0].replace('_', '-')} shapes the quick loop's model; with Megatron-LM the model "
                           "comes from --preset and --megatron-args")
    if lm_plan.launcher_shape() is not None:
        raise F.FlagsError("validate launches its own ranks, one torchrun per arm: under torchrun or srun run "
                           "`megatron arm` once per arm, then `megatron compare` on their records")
    from .lm.commands import cmd_validate as lm_validate
    args.megatron_lm = found
    fit_window(args, 30, 10)
    return lm_validate(args, cands)


def cmd_arm(args, argv) -> int:
    from .lm import commands, plan as lm_plan
    output_to(args.out)
    args.checkout_from = lm_plan.checkout_source(args.megatron_lm)
    args.dispatcher, args.megatron_lm = args.dispatcher[0], lm_plan.find_checkout(args.megatron_lm)
    if not args.megatron_lm:
        raise LmError("no Megatron-LM checkout: --megatron-lm PATH (or $MEGATRON_LM)")
    fit_window(args, 30, 10)
    return commands.cmd_arm(args)


def cmd_compare(args, argv) -> int:
    from .lm import commands
    output_to(args.out)
    return commands.cmd_compare(args)


def output_to(out: str | None) -> None:
    """LmError unless --out can be written (before any work); the tables to stderr when it is stdout."""
    bad_out = cli.output_problem(out, "--out")
    if bad_out:
        raise LmError(bad_out)
    cli.text_to_stderr(out)


VERBS = {"flags": cmd_flags, "validate": cmd_validate, "arm": cmd_arm, "compare": cmd_compare}


@cli.tool
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        bad_launch = ((launcher.problem() or open_files_problem(args.ep or 2))      # they start ranks
                      if args.cmd in ("validate", "arm") else "")
        if bad_launch:
            raise LmError(bad_launch)
        return VERBS[args.cmd](args, argv)
    except (F.FlagsError, LmError, RecordError, RepeatError) as e:
        cli.error(f"moebench.megatron {args.cmd}", e)
        return 2
