"""python -m moebench.dispatch: time isolated dispatch and combine for each backend, after a
correctness check, on identical routing; report GB/s under one byte rule against link ceilings.

Without a GPU (or with --device cpu) it runs on CPU/gloo: a functional run, not a measurement.
"""
from __future__ import annotations

import argparse
import sys

import torch

from . import results, sweep
from .backends import base
from .launch import joined_env
from .runner import Options, run_case
from .workload import DTYPES, Workload, WorkloadError

CPU_DEFAULT_SHAPE = {"num_tokens": 256, "hidden": 1024}   # keeps --ep 8 under a minute on 2 cores


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moebench.dispatch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-tokens", type=int, help="tokens per rank (default 4096; CPU 256)")
    p.add_argument("--hidden", type=int, help="hidden size (default 7168; CPU 1024)")
    p.add_argument("--num-experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--ep", type=int, default=8, help="expert-parallel ranks")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per NVLink node (byte-rule split)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="dispatch payload (combine is bf16)")
    p.add_argument("--routing", default="uniform",
                   help="uniform | balanced | zipf:S | group:G:M | trace:FILE, optionally ,masked:P")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="all", help=f"all or a list of: {', '.join(base.names())}")
    p.add_argument("--iters", type=int, help="timed iterations (default 20; CPU 5)")
    p.add_argument("--warmup-ms", type=float, help="warm-up budget per phase (default 200; CPU 0)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--ranks-per-gpu", type=int, default=1, metavar="N",
                   help="shared-GPU ranks: N EP ranks per GPU (gloo group, CUDA IPC on one device) to run "
                        "real backends on fewer GPUs than EP ranks; functional only, never performance figures")
    p.add_argument("--out", default="moebench-dispatch.jsonl", help="JSONL file to append to")
    p.add_argument("--ceiling-gbps", type=float, help="override the nominal per-GPU link ceiling")
    p.add_argument("--num-sms", type=int, help="SMs for deepep/hybridep kernels")
    p.add_argument("--ops-impl", default="auto", choices=("auto", "torch", "triton", "cuda"),
                   help="permute/unpermute implementation of the alltoall path")
    p.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE",
                   help="backend knob, repeatable (e.g. mode=plain, num_sms_dispatch=16)")
    p.add_argument("--no-flush-l2", action="store_true", help="skip the L2 flush before timed calls")
    p.add_argument("--profile", action="store_true",
                   help="also record each phase's GPU kernels (CPU: torch ops) per call, from the profiler")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per backend launch")
    sweep.add_args(p)       # --sweep NAME, --knob-sweep, --max-cases, --redo-failed (moebench/sweep.py)
    return p


def pick_device(requested: str, ep: int, ranks_per_gpu: int = 1) -> tuple[str, str]:
    """(device, note). EP larger than the visible GPUs is an error only when cuda was asked for.
    With shared-GPU ranks, EP ranks need ceil(EP / ranks_per_gpu) GPUs and the device is cuda."""
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ranks_per_gpu < 1:
        raise WorkloadError(f"--ranks-per-gpu must be >= 1, got {ranks_per_gpu}")
    if ranks_per_gpu > 1:
        need = -(-ep // ranks_per_gpu)
        if requested == "cpu" or ngpu == 0:
            raise WorkloadError(f"--ranks-per-gpu {ranks_per_gpu} shares GPUs between ranks, but "
                                f"{'--device cpu was asked for' if requested == 'cpu' else 'no GPU is visible'}")
        if need > ngpu:
            raise WorkloadError(f"--ep {ep} with --ranks-per-gpu {ranks_per_gpu} needs {need} GPUs but {ngpu} "
                                "are visible")
        return "cuda", (f"{ep} ranks sharing {need} GPU(s) ({ranks_per_gpu} per GPU, gloo group): "
                        "functional only, NOT performance figures")
    joined = joined_env()
    if joined is not None:
        if joined[1] != ep:
            raise WorkloadError(f"--ep {ep} but the launcher started {joined[1]} processes; they must match")
        return ("cpu" if requested == "cpu" or not ngpu else "cuda"), ""
    if requested == "cuda":
        if ngpu < ep:
            raise WorkloadError(
                f"--ep {ep} needs {ep} GPUs but {ngpu} are visible; use --device cpu for a functional "
                "CPU run, or launch with torchrun/srun across nodes (one process per GPU)")
        return "cuda", ""
    if requested == "auto" and ngpu >= ep:
        return "cuda", ""
    note = "" if requested == "cpu" else f"EP {ep} > {ngpu} visible GPUs: "
    return "cpu", note + "running on CPU/gloo: CPU times are functional only, NOT performance figures"


def build(args) -> tuple[Workload, list[str], Options, str]:
    device, note = pick_device(args.device, args.ep, args.ranks_per_gpu)
    cpu = device == "cpu"
    shape = {"num_tokens": args.num_tokens, "hidden": args.hidden}
    for k, v in shape.items():
        if v is None:
            shape[k] = CPU_DEFAULT_SHAPE[k] if cpu else Workload.__dataclass_fields__[k].default
    w = Workload(num_experts=args.num_experts, topk=args.topk, ep=args.ep, dtype=args.dtype,
                 routing=args.routing, seed=args.seed, gpus_per_node=args.gpus_per_node, **shape)
    names = base.parse_backends(args.backend)
    knobs = {"ops_impl": args.ops_impl}
    if args.num_sms is not None:
        knobs["num_sms"] = args.num_sms
    for kv in args.knob:
        key, sep, val = kv.partition("=")
        if not sep or not key:
            raise WorkloadError(f"--knob wants KEY=VALUE, got {kv!r}")
        knobs[key] = int(val) if val.lstrip("-").isdigit() else val
    if args.backend != "all":   # an explicitly named backend that cannot take this run is bad input
        for n in names:
            base.get(n)(knob_values=dict(knobs)).validate(w, w.ep)
    opts = Options(device=device, iters=args.iters or (5 if cpu else 20),
                   warmup_ms=args.warmup_ms if args.warmup_ms is not None else (0.0 if cpu else 200.0),
                   flush_l2=not args.no_flush_l2, timeout_s=args.timeout, knobs=knobs,
                   ceiling_gbps=args.ceiling_gbps, profile=args.profile, ranks_per_gpu=args.ranks_per_gpu)
    return w, names, opts, note


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.sweep:
        return sweep.main_sweep(args, argv)
    try:
        w, names, opts, note = build(args)
    except WorkloadError as e:
        print(f"moebench.dispatch: error: {e}", file=sys.stderr)
        return 2
    joined = joined_env()
    say = print if joined is None or joined[0] == 0 else (lambda *a, **k: None)   # rank 0 reports
    if note:
        say(f"# NOTE: {note}")
    say(f"# workload: T={w.num_tokens} H={w.hidden} E={w.num_experts} K={w.topk} EP={w.ep} "
        f"dtype={w.dtype} routing={w.routing} seed={w.seed} device={opts.device}")
    records = run_case(w, names, opts, list(sys.argv[1:] if argv is None else argv), progress=say)
    if joined is not None and joined[0] != 0:
        return 0
    print(results.format_table(records))
    results.write_jsonl(args.out, records)
    print(f"# {len(records)} records appended to {args.out}")
    if opts.device == "cpu":
        print("# CPU/gloo run: the times above are functional only, not performance figures")
    elif opts.functional:
        print("# shared-GPU run: ranks time-slice one GPU; the times above are functional only, "
              "not performance figures")
    failed = sorted({r["backend"]["name"] for r in records if r["check"]["status"] == "FAIL"})
    if failed:
        print(f"# FAIL: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
