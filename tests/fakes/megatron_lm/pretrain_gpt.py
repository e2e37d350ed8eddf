"""A stand-in for Megatron-LM's pretrain_gpt.py (tests only): the same command line, the same log lines.

It trains nothing. Each iteration runs Megatron-Core's real token dispatcher named on its command line
(MoEAlltoAllTokenDispatcher, or MoEFlexTokenDispatcher with DeepEP / HybridEP stand-ins from
tests/fakes/deep_ep, FAKE_DEEP_EP_CTOR=sim) on CPU/gloo through moebench's mcore backend, so that the
evidence moebench gathers comes from the real classes, and prints what Megatron-LM prints: the argument
dump (rank 0), one iteration line per iteration (last rank), memory reports (rank 0). The lm loss is a
function of the seed, the iteration and the combined tokens (the same for every correct dispatcher).

STANDIN_ELAPSED_MS="alltoall=100,deepep=80": the elapsed time each dispatcher reports (with a small
deterministic jitter); STANDIN_FAIL="DISPATCHER:crash@N|hang@N|nan@N|loss|exit@N" breaks that arm.
"""
import argparse
import math
import os
import sys
import time
import types

import torch
import torch.distributed as dist


def parse():
    p = argparse.ArgumentParser()
    for name, default in (("--train-iters", 10), ("--seed", 1234), ("--global-batch-size", 8), ("--hidden-size", 64),
                          ("--num-experts", 8), ("--moe-router-topk", 2), ("--expert-model-parallel-size", 1),
                          ("--log-memory-interval", 0), ("--seq-length", 64)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--moe-token-dispatcher-type", default="allgather")
    p.add_argument("--moe-flex-dispatcher-backend", default="deepep")
    p.add_argument("--distributed-backend", default="nccl")
    p.add_argument("--moe-router-force-load-balancing", action="store_true")
    args, _ = p.parse_known_args()
    return args


def print_args(args):
    print("------------------------ arguments ------------------------", flush=True)
    for k, v in sorted(vars(args).items()):
        print(f"  {k} {'.' * (48 - len(k))} {v}", flush=True)
    print("-------------------- end of arguments ---------------------", flush=True)


def fail_plan(disp):
    spec = dict(s.split(":", 1) for s in os.environ.get("STANDIN_FAIL", "").split(",") if ":" in s).get(disp, "")
    how, _, at = spec.partition("@")
    return how, int(at or 0)


def elapsed(disp, it, measured_ms):
    table = dict(s.split("=") for s in os.environ.get("STANDIN_ELAPSED_MS", "").split(",") if "=" in s)
    if disp not in table:
        return measured_ms
    return float(table[disp]) * (1 + 0.01 * math.sin(7 * it + len(disp)))


def backend_for(args):
    from moebench.backends.mcore import McoreAlltoallBackend, McoreDeepEPBackend, McoreHybridEPBackend
    if args.moe_token_dispatcher_type == "alltoall":
        return "alltoall", McoreAlltoallBackend
    b = args.moe_flex_dispatcher_backend
    return b, {"deepep": McoreDeepEPBackend, "hybridep": McoreHybridEPBackend}[b]


def main():
    args = parse()
    args.rank, args.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args.moe_flex_dispatcher_backend = args.moe_flex_dispatcher_backend if args.moe_token_dispatcher_type == "flex" else None
    training = types.ModuleType("megatron.training")          # what moebench reads: megatron.training.get_args()
    training.get_args = lambda: args
    sys.modules["megatron.training"] = training
    dist.init_process_group(args.distributed_backend, rank=args.rank, world_size=args.world_size)
    if args.rank == 0:
        print_args(args)
    from moebench.core.workload import Workload, rank_inputs
    disp, cls = backend_for(args)
    w = Workload(num_tokens=16, hidden=args.hidden_size, num_experts=args.num_experts, topk=args.moe_router_topk,
                 ep=args.world_size, seed=args.seed)
    b = cls(knob_values={"mcore_cpu_emulation": True})
    b.setup(dist.group.WORLD, w, torch.device("cpu"))
    how, at = fail_plan(disp)
    last = args.rank == args.world_size - 1
    for it in range(1, args.train_iters + 1):
        t0 = time.perf_counter()
        if it == at and how == "crash":
            raise RuntimeError(f"stand-in: {disp} crashed at iteration {it}")
        if it == at and how == "hang":
            time.sleep(3600)
        if it == at and how == "exit":
            sys.exit(3)
        x, idx, wt, _, _ = rank_inputs(w.replace(seed=args.seed + it), args.rank)
        d = b.dispatch(x, idx, wt)
        out = b.combine(d.x_RH, d.handle)
        energy = torch.tensor([float((out.float() - x.float()).abs().sum())])
        dist.all_reduce(energy)
        loss = 10.5 * math.exp(-it / 8) + 0.5 + 1e-3 * float(energy)
        if how == "loss":
            loss *= 1.1
        nan = int(how == "nan" and it == at)
        ms = elapsed(disp, it, 1e3 * (time.perf_counter() - t0))
        if last:
            loss_s = "" if nan else f" lm loss: {loss:.6E} |"
            print(f" [2026-12-04 12:00:00.000000] iteration {it:8d}/{args.train_iters:8d} | consumed samples: "
                  f"{it * args.global_batch_size:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
                  f"(TFLOP/s/GPU): {1000 / ms:.1f} | learning rate: 1.000000E-04 | global batch size: "
                  f"{args.global_batch_size:5d} |{loss_s} loss scale: 1.0 | grad norm: 1.234 | number of skipped "
                  f"iterations:   0 | number of nan iterations: {nan:3d} |", flush=True)
        if args.rank == 0 and (it <= 2 or (args.log_memory_interval and it % args.log_memory_interval == 0)):
            print(f"[Rank 0] (after {it} iterations) memory (MB) | allocated: 100.00 | max allocated: 200.00 | "
                  f"reserved: 300.00 | max reserved: {300 + 10 * (disp != 'alltoall'):.2f}", flush=True)


if __name__ == "__main__":
    main()
