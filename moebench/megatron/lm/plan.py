"""The plan of a Megatron-LM validation: where the ranks run, and each arm's command and environment.

Rules that refuse before any launch (LmError, exit 2), so that an A/B is evidence for what it claims:
flex needs TP x EP > 1 (Megatron asserts it); `--moe-grouped-gemm` needs `--disable-bias-linear`;
HybridEP on megatron-core <= 0.19 cannot dispatch FP8 (fused_a2a asserts it); the experts must divide
by EP and EP by the world; HybridEP's ranks per NVLink domain must divide EP x TP and fit the NVLink
domain found here.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from ...core.megatron_map import BACKENDS, CONTROL
from ...env.te import te_nccl_ep_problem
from ...env import launcher
from ...env.toolkit import dist_version, installed
from .. import flags as F
from ...harness.placement import PlacementError, place, visible_gpus
from .arm import ArmPlan, Launch
from .args import (NO_TE_FLAGS, PRESETS, SHARED_GPU_FLAGS, Checkout, LmError, flag_value, inspect_checkout,
                      model_flags, run_flags, user_args)

DEFAULT_PATHS = ("/opt/megatron-lm",)


def checkout_source(path: str | None) -> str:
    """Where find_checkout(path) took the checkout from, as an error names it."""
    return "--megatron-lm" if path or not os.environ.get("MEGATRON_LM") else "$MEGATRON_LM"


def find_checkout(path: str | None) -> str | None:
    """--megatron-lm PATH, else $MEGATRON_LM, else a container's /opt/megatron-lm; None when none is at hand."""
    if path:
        return path
    if os.environ.get("MEGATRON_LM"):
        return os.environ["MEGATRON_LM"]
    return next((p for p in DEFAULT_PATHS if os.path.isfile(os.path.join(p, "pretrain_gpt.py"))), None)


def launcher_shape() -> tuple[int, int, str] | None:
    """(world, ranks on this node, launcher) when this process is a rank started by torchrun or srun."""
    return launcher.shape()


def make_launch(device: str, ep: int | None, ranks_per_gpu: int, joined=None) -> Launch:
    """Local: every visible GPU (x ranks_per_gpu), or --ep ranks on CPU. Under a launcher: its shape."""
    ngpu = visible_gpus()
    cpu = device == "cpu"
    if cpu and ranks_per_gpu > 1:
        raise LmError(f"--ranks-per-gpu {ranks_per_gpu} shares GPUs, but --device cpu was asked for")
    if not cpu and ngpu == 0:
        raise LmError("Megatron-LM's pretrain_gpt.py needs CUDA and no GPU is visible (--device cpu runs the arms "
                      "on CPU/gloo, for a stand-in of pretrain_gpt.py only)")
    if joined is not None:
        world, per_node, how = joined
        if world % per_node:
            raise LmError(f"{world} ranks do not split into nodes of {per_node}: launch the same number on every node")
        return Launch("cpu" if cpu else "cuda", per_node, ep or world, nnodes=world // per_node,
                      ranks_per_gpu=ranks_per_gpu, launcher=how)
    if cpu:
        return Launch("cpu", ep or 1, ep or 1)
    nproc = ngpu * ranks_per_gpu
    try:
        place("cuda", nproc, ranks_per_gpu, ngpu=ngpu)      # the one rule for every tool (harness/placement.py)
    except PlacementError as e:
        raise LmError(str(e)) from None
    return Launch("cuda", nproc, ep or nproc, ranks_per_gpu=ranks_per_gpu)


def nvlink_domain_ranks(launch: Launch) -> tuple[int, str]:
    """(ranks per NVLink domain found here, how it was found): the ranks of one node, whose GPUs NVLink
    connects (or that share one GPU); 1 where NVML says this node's GPUs have no NVLink up."""
    if launch.ranks_per_gpu > 1 or launch.device == "cpu":
        return launch.nproc_per_node, "the ranks of this node share its GPU(s)"
    from ...env.topology import inventory
    gpus = inventory().gpus
    if len(gpus) > 1 and all(g.nvlinks_up == 0 for g in gpus):
        return 1, "NVML reports no NVLink up between this node's GPUs"
    return launch.nproc_per_node, "the GPUs of one node (NVLink-connected, or NVML cannot tell)"


@dataclass
class Plan:
    checkout: Checkout
    launch: Launch
    arms: list[ArmPlan]
    validation: str
    no_te: list[str] | None
    version: str
    notes: list[str]
    topology: dict

    def context(self, start_utc: str) -> dict:
        """What every arm record of this plan shares (lm_arm.make_record)."""
        return {"validation": self.validation, "checkout": self.checkout.__dict__, "no_te": self.no_te,
                "launch": self.launch, "topology": self.topology, "start_utc": start_utc}


def check_rules(argv: list[str], dispatchers: list[str], launch: Launch, version: str, domain: int | None,
                domain_found: tuple[int, str]) -> None:
    tp = int(flag_value(argv, "--tensor-model-parallel-size") or 1)
    experts = flag_value(argv, "--num-experts")
    if experts is None:
        raise LmError("the model has no --num-experts: nothing to dispatch (use a --preset or give it in --megatron-args)")
    if int(experts) % launch.ep:
        raise LmError(f"--num-experts {experts} is not divisible by EP {launch.ep}")
    if (launch.world // tp) % launch.ep:
        raise LmError(f"EP {launch.ep} does not divide the {launch.world // tp} data-parallel ranks ({launch.world} "
                      f"ranks, TP {tp})")
    if "--moe-grouped-gemm" in argv and "--disable-bias-linear" not in argv:
        raise LmError("--moe-grouped-gemm needs --disable-bias-linear (Megatron's grouped GEMM has no bias)")
    fp8 = flag_value(argv, "--fp8-format") is not None
    for d in dispatchers:
        if BACKENDS[d].flex and tp * launch.ep < 2:
            raise LmError(f"{d} runs on Megatron's flex dispatcher, which needs TP x EP > 1 (Megatron asserts it); "
                          f"here TP {tp} x EP {launch.ep} = 1")
        if d == "ncclep" and (why := te_nccl_ep_problem()):
            raise LmError(f"ncclep needs {BACKENDS[d].requires}: {why}, so Megatron would stop at its first step")
        if d == "hybridep" and fp8 and F.parse_version(version) <= (0, 19):
            raise LmError(f"hybridep cannot dispatch FP8 on megatron-core {version} (fused_a2a asserts 'HybridEP "
                          "dispatcher does not support fp8 dispatch'): an FP8 A/B is no evidence for it there")
    if "hybridep" in dispatchers:
        found, how = domain_found
        dom = domain or found
        if dom > found:
            raise LmError(f"--ranks-per-nvlink-domain {dom} exceeds the NVLink domain found here: {found} ranks ({how})")
        if (tp * launch.ep) % dom:
            raise LmError(f"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN {dom} does not divide EP x TP = {tp * launch.ep}")


def plan(opts, dispatchers: list[str], joined=None) -> Plan:
    """opts: the parsed validate/arm options (megatron_lm, preset, megatron_args, iters, seed, device, ep,
    ranks_per_gpu, num_sms, overlap, ranks_per_nvlink_domain)."""
    installed_core = dist_version("megatron-core", "megatron_core")
    ck = inspect_checkout(opts.megatron_lm, installed_core, os.environ.get("MEGATRON_LM_COMMIT"),
                          getattr(opts, "checkout_from", "--megatron-lm"))
    launch = make_launch(opts.device, opts.ep, opts.ranks_per_gpu, joined)
    version = ck.core_used or installed_core or "0.19.0"
    extra = user_args(opts.megatron_args)
    model = model_flags(opts.preset, [])
    tp = int(flag_value([*model, *extra], "--tensor-model-parallel-size") or 1)
    batch = (PRESETS[opts.preset].batch_per_rank if opts.preset in PRESETS else 1) * (launch.world // tp)
    no_te = None if installed("transformer_engine") else list(NO_TE_FLAGS)
    common = [*model, *run_flags(opts.iters, opts.seed, batch), *(no_te or []),
              *(SHARED_GPU_FLAGS if launch.functional else ()), *extra]
    found = nvlink_domain_ranks(launch)
    check_rules(common, [CONTROL, *dispatchers], launch, version, opts.ranks_per_nvlink_domain, found)
    arms = []
    for role, d in [("control", CONTROL)] + [("candidate", d) for d in dispatchers]:
        fs = F.megatron_flags(d, version, opts.num_sms if BACKENDS[d].flex else None, opts.overlap, ep=launch.ep,
                              ranks_per_nvlink_domain=(opts.ranks_per_nvlink_domain or found[0]))
        argv = [ck.pretrain, *common, *fs.megatron_lm, "--expert-model-parallel-size", str(launch.ep)]
        arms.append(ArmPlan(role, d, argv, list(fs.megatron_lm), dict(fs.env), fs.asdict()))
    key = json.dumps([common, launch.asdict(), ck.path], sort_keys=True)
    from ...env.topology import inventory
    topo = {"nvlink_domain_ranks": found[0], "how": found[1], "gpus": inventory().asdict()["gpus"]}
    return Plan(ck, launch, arms, hashlib.sha256(key.encode()).hexdigest()[:12], no_te, version, list(ck.notes), topo)
