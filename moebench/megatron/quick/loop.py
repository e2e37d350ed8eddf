"""`megatron validate --quick`: the built-in megatron-core training loop (train.py), the quick check
where no Megatron-LM checkout is at hand. The control (alltoall), then the candidate, each in its own
set of rank processes; under torchrun/srun every rank takes part in every run (rank 0 alone writes the
records and prints), so the sequence never waits on a rank that left.
"""
from __future__ import annotations

import sys

from ... import cli
from ...core.megatron_map import BACKENDS, CONTROL
from ...env.toolkit import installed
from ...records import provenance, writer
from ...records.megatron import LoopRecord
from ..flags import FlagsError

CPU_PACE = ("on CPU the default model takes ~10 s a step with 2 ranks on 2 cores (50 steps: ~8 min per run);\n"
            "# --iters 10 --hidden 256 --heads 4 --ffn-hidden 512 --seq-length 256 --vocab 4096 takes ~3 s")
MODEL_OPTIONS = ("num_layers", "hidden", "heads", "ffn_hidden", "num_experts", "topk", "seq_length", "micro_batch",
                 "vocab", "lr", "aux_loss_coeff")
TABLE = ("run", "dispatcher", "ran (class / manager)", "step ms", "TFLOP/s/GPU", "loss first->last win",
         "nan/skip", "peak GiB", "status")


def spec_of(args):
    from .train import TrainSpec
    given = {k: getattr(args, k) for k in MODEL_OPTIONS + ("window",) if getattr(args, k, None) is not None}
    spec = TrainSpec(steps=args.iters or TrainSpec.steps, seed=args.seed, num_sms=args.num_sms, **given)
    if spec.steps < 2:
        raise FlagsError(f"--iters must be >= 2 for the quick loop (first and last loss windows), got {spec.steps}")
    if spec.hidden % spec.heads:
        raise FlagsError(f"--hidden {spec.hidden} is not divisible by --heads {spec.heads}")
    if spec.topk > spec.num_experts:
        raise FlagsError(f"--topk {spec.topk} exceeds --num-experts {spec.num_experts}")
    return spec


def memory_problem(spec, device: str, world: int) -> str:
    """'' when the quick loop's model fits here (a floor, counted before any rank starts: per rank, 16 bytes per
    parameter for bf16 weights, fp32 masters, gradients and Adam's two moments, plus the fp32 logits and their
    gradient, [micro_batch, seq_length, vocab] twice); else one line, so that --hidden 10^6 is no allocator FAIL."""
    from ...harness.preflight import GiB, available_bytes
    H, F, L, V = spec.hidden, spec.ffn_hidden, spec.num_layers, spec.padded_vocab
    local = -(-spec.num_experts // world)
    params = 2 * V * H + L * (4 * H * H + H * spec.num_experts + 3 * local * H * F)
    per_rank = 16 * params + 8 * spec.micro_batch * spec.seq_length * V
    have = available_bytes(device)
    need = per_rank * (world if device == "cpu" else 1)
    if have is None or need <= have:
        return ""
    return (f"the quick loop's model needs at least ~{need / GiB:.1f} GiB ({world} rank(s), ~{params / 1e9:.2f} G "
            f"parameters each with Adam's state, and the logits), {have / GiB:.1f} GiB "
            f"{'available' if device == 'cpu' else 'on the GPU'}: lower --hidden, --ffn-hidden, --num-layers, "
            "--vocab or --seq-length")


def environment(args, dispatcher: str, num_experts: int) -> tuple[str, int]:
    """(device type, world) from the one placement rule (harness/placement.py); FlagsError (exit 2) when this
    machine cannot run it."""
    from ...harness.launch import join_problem, joined_env
    from ...harness.placement import PlacementError, place, visible_gpus
    if not installed("megatron.core"):
        raise FlagsError("validate needs megatron-core (pip install megatron-core)")
    joined, ngpu, rpg, cpu = joined_env(), visible_gpus(), args.ranks_per_gpu, args.device == "cpu"
    if cpu and BACKENDS[dispatcher].flex and rpg == 1:
        raise FlagsError(f"--device cpu runs --dispatcher alltoall only ({dispatcher} needs GPUs)")
    if not cpu and ngpu == 0:
        raise FlagsError("validate needs CUDA: no GPU is visible (megatron-core's dispatchers and model run on "
                         "GPU); --device cpu runs a functional check of the training loop only, not a validation")
    if joined and rpg > 1:
        raise FlagsError("--ranks-per-gpu starts its own ranks: leave it out under torchrun / srun")
    world = joined[1] if joined else (args.ep or (1 if cpu else ngpu * rpg))
    try:
        where = place("cpu" if cpu else "cuda", world, rpg, joined, ngpu)
    except PlacementError as e:
        raise FlagsError(str(e)) from None
    if dispatcher == "ncclep":
        raise FlagsError("the quick loop runs megatron-core's dispatchers through moebench's mcore-* backends, and "
                         "there is no mcore-ncclep (megatron-core reaches NCCL EP through Transformer Engine): validate "
                         "ncclep with --megatron-lm (Megatron-LM's own pretrain_gpt.py)")
    if BACKENDS[dispatcher].flex:
        if world < 2:
            raise FlagsError(f"--dispatcher {dispatcher} needs EP >= 2 (Megatron's flex dispatcher asserts TPxEP > 1)")
        if not installed("deep_ep"):
            raise FlagsError(f"--dispatcher {dispatcher} needs deep_ep installed (WAIVED here)")
    if num_experts % world:
        raise FlagsError(f"--num-experts {num_experts} is not divisible by EP {world}")
    if joined and (why := join_problem(args.timeout)):       # the job's other ranks, before any work
        raise FlagsError(why)
    return where.device, world


def run_training(spec, dispatcher: str, device: str, world: int, timeout: float, ranks_per_gpu: int = 1) -> dict | None:
    """One run on every rank; its summary on rank 0 (or the sole process), None on the other ranks of a
    torchrun/srun job."""
    from ...harness.launch import LaunchError, run_ranks
    from .train import rank_train, summarize
    try:
        ranks = run_ranks(rank_train, world, device, timeout, args=(spec, dispatcher, device == "cpu"),
                          ranks_per_gpu=ranks_per_gpu)
    except LaunchError as e:
        print(str(e), file=sys.stderr)
        return {"dispatcher": dispatcher, "world": world, "status": "FAIL", "errors": [str(e).splitlines()[0][:1500]]}
    if not ranks:
        return None
    return summarize(ranks, spec, dispatcher, world)


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


def compare_to_control(out: list[dict]) -> None:
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


def cmd_quick(args, argv, dispatcher: str) -> int:
    spec = spec_of(args)
    device, world = environment(args, dispatcher, spec.num_experts)
    too_big = memory_problem(spec, device, world)
    if too_big:
        raise FlagsError(too_big)
    shared = args.ranks_per_gpu > 1
    runs = [] if args.no_control or dispatcher == CONTROL else [("control", CONTROL)]
    runs.append(("candidate", dispatcher))
    from ...harness.launch import is_lead
    lead = is_lead()
    say = print if lead else (lambda *a, **k: None)
    if device == "cpu":
        say(f"# CPU functional run (CUDA calls emulated): not a measurement and not a validation\n# {CPU_PACE}")
    elif shared:
        say(f"# shared-GPU run: {world} ranks, {args.ranks_per_gpu} per GPU (gloo groups, CUDA IPC on one device): "
            "the training path is real, its step times and TFLOP/s are functional only, not a measurement")
    say("# engine: the built-in megatron-core loop (quick check); Megatron-LM's pretrain_gpt.py: --megatron-lm PATH")
    out = []
    for role, disp in runs:
        say(f"# {role}: megatron-core GPT-MoE, dispatcher {disp}, EP {world}, {spec.steps} iterations ...", flush=True)
        try:
            r = run_training(spec, disp, device, world, args.timeout, args.ranks_per_gpu)
        except KeyboardInterrupt as e:
            kept = f"{len(out)} record(s) ({', '.join(x['role'] for x in out)}) kept in {args.out}" if out else "nothing kept"
            raise cli.Interrupted.after(e, f"{kept}; not run: {role} and after") from None
        if r is None:          # another rank of a launcher's job: it takes part in every run, rank 0 reports
            continue
        r["role"] = role
        out.append(r)
        compare_to_control(out)
        rec = LoopRecord(argv=argv, repro=provenance.repro_command(argv, "moebench.megatron"), device=device,
                         role=role, dispatcher=disp, status=r["status"], errors=r["errors"],
                         functional=device == "cpu" or shared, result=r, env=provenance.provenance(),
                         end_utc=provenance.utc_now(),
                         shared_gpu={"ranks_per_gpu": args.ranks_per_gpu} if shared else None)
        writer.write_jsonl(args.out, [rec.asdict()])      # on disk as each run ends
    if not lead:
        return 0
    return _report(out, args, device, shared, dispatcher)


def _report(out: list[dict], args, device: str, shared: bool, dispatcher: str) -> int:
    from tabulate import tabulate
    print(tabulate([_row(r["role"], r) for r in out], headers=TABLE, tablefmt="simple", disable_numparse=True))
    print(f"# {len(out)} records appended to {args.out} as each run finished")
    failed = [r for r in out if r["status"] != "PASS"]
    what = ("CPU functional run (not a validation: run on GPUs for that)" if device == "cpu" else
            "shared-GPU functional run (the dispatcher path trained; times are no measurement)" if shared else
            "quick validation")
    print(f"# {what} {'FAILED' if failed else 'PASSED'} for {dispatcher}", file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0
