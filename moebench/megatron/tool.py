"""python -m moebench.megatron: hand a dispatcher choice to Megatron, and prove it in training.

  flags     Megatron-LM flags, Megatron-Bridge overrides and env for the winner of a matched A/B in
            a moebench results file (--results FILE, one decision per workload), or for a named
            backend (--backend NAME [--num-sms N]). A candidate replaces alltoall only when it beats
            it by more than the measured noise (see moebench/megatron/flags.py).
  validate  A short megatron-core training run (small GPT with MoE layers, mock data, same seed):
            the control (alltoall), then the candidate, each in its own launch. Reports steady-window
            step time, model TFLOP/s per GPU (Megatron's arithmetic), loss finite and falling, skipped/
            NaN steps, peak memory per rank, and which dispatcher class ran. Exit 1 when it fails.
            Needs GPUs; --device cpu is a functional check of the loop (alltoall), never a validation.
"""
from __future__ import annotations

import argparse
import json
import sys

from .. import cli
from ..core.megatron_map import BACKENDS, CONTROL
from ..env.toolkit import dist_version, installed
from ..records import provenance, writer
from ..records.schema import FUNCTIONAL_NOTE, SAMPLED_VIEWS, performance_only, read_dispatch
from . import flags as F

VALIDATE_SCHEMA = "moebench.megatron.validate/1"
CPU_PACE = ("on CPU the default model takes about 10 s a step with 2 ranks on 2 cores (50 steps: ~8 min, each of the "
            "two runs); --steps 10 --hidden 256 --heads 4 --ffn-hidden 512 --seq-length 256 --vocab 4096 takes ~3 s")
FLAGS_SCHEMA = "moebench.megatron.flags/1"


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m moebench.megatron", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("flags", help="Megatron settings from results or a backend name")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", help="moebench.dispatch JSONL file")
    src.add_argument("--backend", help=" | ".join(BACKENDS) + " (mcore-* accepted)")
    f.add_argument("--num-sms", type=cli.count(), help="SMs for deepep/hybridep (default: from the winning record)")
    f.add_argument("--megatron-core-version", help="target megatron-core (default: the installed one)")
    f.add_argument("--overlap", action="store_true", help="also emit EP comm/compute overlap settings")
    f.add_argument("--ep", type=cli.count(), help="EP of the training run (--backend mode; gates --overlap)")
    f.add_argument("--ranks-per-nvlink-domain", type=cli.count(),
                   help="GPUs per NVLink domain for HybridEP's env (--backend mode)")
    f.add_argument("--min-gain", type=cli.number(0), default=0.0,
                   help="also require the gain to exceed this fraction of alltoall's time (default 0)")
    f.add_argument("--view", choices=SAMPLED_VIEWS, default="api",
                   help="timing view of the A/B (default api: what a training step pays without CUDA graphs; graph "
                        "for steps replayed from CUDA graphs); the verdict names it")
    f.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    v = sub.add_parser("validate", help="short megatron-core training check of a dispatcher")
    v.add_argument("--dispatcher", choices=tuple(BACKENDS), required=True)
    v.add_argument("--ep", type=cli.count(), help="EP = world size (default: visible GPUs)")
    from .train import TrainSpec
    t0 = TrainSpec()          # the training run's defaults, defined once there
    for name, what in (("steps", "training steps, >= 2 (first and last loss windows)"), ("num_layers", ""), ("hidden", ""), ("heads", ""), ("ffn_hidden", "expert FFN hidden size"),
                       ("num_experts", ""), ("topk", ""), ("seq_length", ""), ("micro_batch", ""), ("vocab", ""),
                       ("lr", ""), ("seed", ""), ("aux_loss_coeff", "0 = no load-balancing loss")):
        default = getattr(t0, name)
        kind = {"steps": cli.count(2), "seed": cli.seed, "lr": cli.number(0, strict=True),
                "aux_loss_coeff": cli.number(0)}.get(name, cli.count())
        v.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                       help=f"{what + ' ' if what else ''}(default {default:g})")
    v.add_argument("--num-sms", type=cli.count(), help="SMs for deepep/hybridep")
    v.add_argument("--ranks-per-gpu", type=cli.count(), default=1, metavar="N",
                   help="shared-GPU ranks: N training ranks per GPU (gloo groups, CUDA IPC on one device), so the flex "
                        "dispatchers (EP >= 2) train on one GPU; a functional check, its times are no measurement")
    v.add_argument("--no-control", action="store_true", help="skip the alltoall control run")
    v.add_argument("--out", default="moebench-megatron.jsonl", help="JSONL file to append to")
    v.add_argument("--timeout", type=cli.number(0, strict=True), default=900.0, help="seconds per launch")
    v.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="validate needs GPUs (auto, cuda); cpu runs the same training loop on CPU/gloo with "
                        "megatron-core's few CUDA calls emulated, --dispatcher alltoall only: a functional check "
                        "that the code path works, not a validation and not a measurement")
    return p


def cmd_flags(args) -> int:
    version = args.megatron_core_version or dist_version("megatron-core")
    if not version:
        raise F.FlagsError("megatron-core is not installed here: pass --megatron-core-version V")
    F.parse_version(version)
    if args.results:
        try:
            recs = read_dispatch([args.results], require=True)
        except (OSError, ValueError) as e:
            raise F.FlagsError(f"--results {e}") from None
        if not (recs := performance_only(recs, "megatron flags")):
            raise F.FlagsError(f"every record in {args.results} is {FUNCTIONAL_NOTE}: measure on the target GPUs")
        decisions = F.decisions_from_results(recs, version, args.overlap, args.num_sms, args.min_gain, args.view)
    else:
        fs = F.megatron_flags(args.backend, version, args.num_sms, args.overlap, args.ep, args.ranks_per_nvlink_domain)
        decisions = [{"workload": None, "device": None, "family": None, "control": None, "candidates": [],
                      "winner": fs.backend, "winner_record": None, "reason": "requested with --backend",
                      "flags": fs.asdict()}]
    if args.json:
        print(json.dumps({"schema": FLAGS_SCHEMA, "megatron_core_version": version, "decisions": decisions},
                         indent=1, default=str))
    else:
        print("\n\n".join(F.format_decision(d) for d in decisions))
    return 0


def _validate_spec(args):
    from .train import TrainSpec
    spec = TrainSpec(steps=args.steps, num_layers=args.num_layers, hidden=args.hidden, heads=args.heads,
                     ffn_hidden=args.ffn_hidden, num_experts=args.num_experts, topk=args.topk,
                     seq_length=args.seq_length, micro_batch=args.micro_batch, vocab=args.vocab, lr=args.lr,
                     seed=args.seed, aux_loss_coeff=args.aux_loss_coeff, num_sms=args.num_sms)
    if spec.hidden % spec.heads:
        raise F.FlagsError(f"--hidden {spec.hidden} is not divisible by --heads {spec.heads}")
    if spec.topk > spec.num_experts:
        raise F.FlagsError(f"--topk {spec.topk} exceeds --num-experts {spec.num_experts}")
    return spec


def _validate_env(args) -> tuple[str, int]:
    """(device type, world); raises FlagsError (exit 2) when this machine cannot run it."""
    import torch

    from ..harness.launch import joined_env
    if not installed("megatron.core"):
        raise F.FlagsError("validate needs megatron-core (pip install megatron-core)")
    joined = joined_env()
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cpu":
        if args.ranks_per_gpu > 1:
            raise F.FlagsError(f"--ranks-per-gpu {args.ranks_per_gpu} shares GPUs between ranks, but --device cpu "
                               "was asked for")
        if BACKENDS[args.dispatcher].flex:
            raise F.FlagsError(f"--device cpu runs --dispatcher alltoall only ({args.dispatcher} needs GPUs)")
        world = args.ep or 1
        if args.num_experts % world:
            raise F.FlagsError(f"--num-experts {args.num_experts} is not divisible by EP {world}")
        return "cpu", world
    if ngpu == 0:
        raise F.FlagsError("validate needs CUDA: no GPU is visible (megatron-core's dispatchers and model run on "
                           "GPU); --device cpu runs a functional check of the training loop only, not a validation")
    rpg = args.ranks_per_gpu
    world = joined[1] if joined else (args.ep or ngpu * rpg)
    if joined and rpg > 1:
        raise F.FlagsError("--ranks-per-gpu starts its own ranks: leave it out under torchrun / srun")
    if not joined and -(-world // rpg) > ngpu:
        raise F.FlagsError(f"--ep {world} needs {-(-world // rpg)} GPUs at --ranks-per-gpu {rpg}, {ngpu} visible "
                           "(--ranks-per-gpu N shares GPUs, functional only; or launch with torchrun)")
    if BACKENDS[args.dispatcher].flex:
        if world < 2:
            raise F.FlagsError(f"--dispatcher {args.dispatcher} needs EP >= 2 "
                               "(Megatron's flex dispatcher asserts TPxEP > 1)")
        if not installed("deep_ep"):
            raise F.FlagsError(f"--dispatcher {args.dispatcher} needs deep_ep installed (WAIVED here)")
    if args.num_experts % world:
        raise F.FlagsError(f"--num-experts {args.num_experts} is not divisible by EP {world}")
    return "cuda", world


def run_training(spec, dispatcher: str, device: str, world: int, timeout: float, ranks_per_gpu: int = 1) -> dict:
    from ..harness.launch import LaunchError, run_ranks
    from .train import rank_train, summarize
    try:
        ranks = run_ranks(rank_train, world, device, timeout, args=(spec, dispatcher, device == "cpu"),
                          ranks_per_gpu=ranks_per_gpu)
    except LaunchError as e:
        print(str(e), file=sys.stderr)
        return {"dispatcher": dispatcher, "world": world, "status": "FAIL", "errors": [str(e).splitlines()[0][:1500]]}
    if not ranks:      # a non-zero rank of a torchrun job
        return {}
    return summarize(ranks, spec, dispatcher, world)


TABLE = ("run", "dispatcher", "ran (class / manager)", "step ms", "TFLOP/s/GPU", "loss first->last win",
         "nan/skip", "peak GiB", "status")


def _row(role: str, r: dict) -> list[str]:
    if "step_ms" not in r:
        return [role, r["dispatcher"], "-", "-", "-", "-", "-", "-", "FAIL: " + "; ".join(r["errors"])]
    ev = r["evidence"]["layers"][0]
    cls = ev["dispatcher_class"] + (f" / {ev['comm_manager_class']}" if ev["comm_manager_class"] else "")
    mem = [m for m in r["peak_mem_bytes"] if m is not None]
    status = r["status"] + (": " + "; ".join(r["errors"]) if r["errors"] else "")
    return [role, r["dispatcher"], f"{cls} x{ev['token_dispatch_calls']}", f"{r['step_ms']['steady_mean']:.2f}",
            f"{r['tflops_per_gpu']:.2f}", f"{r['loss']['first_window']:.3f}->{r['loss']['last_window']:.3f}",
            f"{r['nan_steps']}/{r['skipped_steps']}", f"{max(mem) / 2**30:.2f}" if mem else "-", status]


def cmd_validate(args, argv) -> int:
    spec = _validate_spec(args)
    bad_out = cli.output_problem(args.out, "--out")
    if bad_out:
        raise F.FlagsError(bad_out)
    device, world = _validate_env(args)
    shared = args.ranks_per_gpu > 1
    if device == "cpu":
        print("# CPU functional run (CUDA calls emulated): not a measurement and not a validation")
        print(f"# {CPU_PACE}")
    elif shared:
        print(f"# shared-GPU run: {world} ranks, {args.ranks_per_gpu} per GPU (gloo groups, CUDA IPC on one device): "
              "the training path is real, its step times and TFLOP/s are functional only, not a measurement")
    runs = [] if args.no_control or args.dispatcher == CONTROL else [("control", CONTROL)]
    runs.append(("candidate", args.dispatcher))
    out = []
    for role, disp in runs:
        print(f"# {role}: megatron-core GPT-MoE, dispatcher {disp}, EP {world}, {spec.steps} steps ...", flush=True)
        try:
            r = run_training(spec, disp, device, world, args.timeout, args.ranks_per_gpu)
        except KeyboardInterrupt as e:
            kept = f"{len(out)} record(s) ({', '.join(x['role'] for x in out)}) kept in {args.out}" if out else "nothing kept"
            raise cli.Interrupted.after(e, f"{kept}; not run: {role} and after") from None
        if not r:
            return 0
        r["role"] = role
        out.append(r)
        _compare_to_control(out)
        writer.write_jsonl(args.out, [{"schema": VALIDATE_SCHEMA, "argv": argv, "device": device,
                                       "repro": provenance.repro_command(argv, "moebench.megatron"),
                                       "functional": device == "cpu" or shared, **r,
                                       **({"shared_gpu": {"ranks_per_gpu": args.ranks_per_gpu}} if shared else {}),
                                       "env": provenance.provenance(),
                                       "end_utc": provenance.utc_now()}])      # on disk as each run ends
    from tabulate import tabulate
    print(tabulate([_row(r["role"], r) for r in out], headers=TABLE, tablefmt="simple", disable_numparse=True))
    print(f"# {len(out)} records appended to {args.out} as each run finished")
    failed = [r for r in out if r["status"] != "PASS"]
    what = ("CPU functional run (not a validation: run on GPUs for that)" if device == "cpu" else
            "shared-GPU functional run (the dispatcher path trained; times are no measurement)" if shared else
            "validation")
    print(f"# {what} {'FAILED' if failed else 'PASSED'} for {args.dispatcher}",
          file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0


def _compare_to_control(out: list[dict]) -> None:
    """Same seed, same data: the candidate's first loss must match the control's within 2%."""
    ctl = next((r for r in out if r["role"] == "control" and "loss" in r), None)
    for r in out:
        if r["role"] != "candidate" or ctl is None or "loss" not in r:
            continue
        a, b = ctl["loss"]["first"], r["loss"]["first"]
        rel = abs(a - b) / max(abs(a), 1e-9)
        r["vs_control"] = {"first_loss_rel_diff": rel,
                           "step_time_ratio": r["step_ms"]["steady_mean"] / ctl["step_ms"]["steady_mean"]}
        if rel > 0.02:
            r["errors"].append(f"first-step loss {b:.4f} differs from the control's {a:.4f} by {100 * rel:.1f}%")
            r["status"] = "FAIL"


@cli.tool
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        return cmd_flags(args) if args.cmd == "flags" else cmd_validate(args, argv)
    except F.FlagsError as e:
        print(f"moebench.megatron {args.cmd}: error: {e}", file=sys.stderr)
        return 2

