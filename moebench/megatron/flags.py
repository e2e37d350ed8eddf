"""Megatron settings for a dispatcher: Megatron-LM flags, Megatron-Bridge overrides, the Bridge
performance harness's form, and the environment, as one lookup (backend names are Megatron's own values,
README.md "Megatron handoff"). The SM-count flag depends on the megatron-core version:
`--moe-flex-dispatcher-num-sms` from 0.19, `--moe-deepep-num-sms` / `--moe-hybridep-num-sms` before.

Rules that refuse (FlagsError, exit 2) rather than print flags Megatron rejects or that would mislead:
flex needs TP x EP > 1 (Megatron asserts it); HybridEP's ranks per NVLink domain must divide EP x TP and
fit the NVLink domain found. Which backend wins a matched A/B is megatron/ab.py's.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ..core import megatron_map
from ..core.megatron_map import BACKENDS
from ..env.te import TE_FOR_NCCLEP

CHECKED_VERSIONS = ((0, 16), (0, 19))     # megatron-core minor versions the flags were checked against


class FlagsError(ValueError):
    """Bad input for flags: one line on stderr, exit 2."""


def parse_version(v: str) -> tuple[int, int]:
    m = re.match(r"^\s*v?(\d+)\.(\d+)", v or "")
    if not m:
        raise FlagsError(f"cannot read megatron-core version {v!r} (expected e.g. 0.16.1 or 0.19.2)")
    return int(m.group(1)), int(m.group(2))


@dataclass
class FlagSet:
    backend: str
    megatron_core_version: str
    megatron_lm: list[str] = field(default_factory=list)       # argv tokens for pretrain_gpt.py
    megatron_bridge: list[str] = field(default_factory=list)   # Hydra-style key=value overrides
    bridge_perf: list[str] = field(default_factory=list)       # Bridge's scripts/performance/run_script.py form
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def asdict(self) -> dict:
        d = asdict(self)
        d["megatron_lm_cmdline"] = " ".join(self.megatron_lm)
        d["bridge_perf_cmdline"] = " ".join(self.bridge_perf)
        return d


def megatron_flags(backend: str, version: str, num_sms: int | None = None, overlap: bool = False,
                   ep: int | None = None, ranks_per_nvlink_domain: int | None = None, tp: int = 1,
                   domain_found: int | None = None, capacity_factor: float = 1.5, zero_copy: bool = True) -> FlagSet:
    """The Megatron-LM flags, Megatron-Bridge overrides (and its performance harness's form) and env for one
    dispatcher backend. ep / tp: the training run's, where known; domain_found: the ranks per NVLink domain
    found on the target machine, where known; zero_copy: ncclep was timed with Megatron's static shape and zero
    copy (moebench's default, the record's knob zero_copy)."""
    backend = megatron_map.megatron_name(backend)
    if backend in megatron_map.NO_PATH:
        raise FlagsError(megatron_map.NO_PATH[backend])
    if backend not in BACKENDS:
        raise FlagsError(f"no Megatron setting for backend {backend!r} (known: {', '.join(BACKENDS)})")
    mb = BACKENDS[backend]
    if parse_version(version) < mb.since:
        raise FlagsError(f"megatron-core {version} has no {backend} dispatcher (it came in "
                         f"{'.'.join(map(str, mb.since))})")
    if num_sms is not None and num_sms < 1:
        raise FlagsError(f"--num-sms must be >= 1, got {num_sms}")
    check_parallelism(mb, ep, tp, ranks_per_nvlink_domain, domain_found)
    new = parse_version(version) >= (0, 19)
    f = FlagSet(backend, version)
    if not mb.flex:
        f.megatron_lm += ["--moe-token-dispatcher-type", mb.dispatcher_type]
        f.megatron_bridge.append(f"model.moe_token_dispatcher_type={mb.dispatcher_type}")
        if num_sms is not None:
            f.notes.append(f"{backend} runs on NCCL: an SM count does not apply and is not emitted")
    else:
        f.megatron_lm += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", backend]
        f.megatron_bridge += ["model.moe_token_dispatcher_type=flex", f"model.moe_flex_dispatcher_backend={backend}"]
        if num_sms is not None:
            key = "moe_flex_dispatcher_num_sms" if new else f"moe_{backend}_num_sms"
            f.megatron_lm += ["--" + key.replace("_", "-"), str(num_sms)]
            f.megatron_bridge.append(f"model.{key}={num_sms}")
        else:
            f.notes.append(f"no SM count measured or given: Megatron's default applies ({mb.default_sms})")
        if mb.domain_env:
            if ranks_per_nvlink_domain:
                f.env[mb.domain_env] = str(ranks_per_nvlink_domain)
            else:
                f.notes.append(f"set {mb.domain_env} to the GPUs per NVLink domain "
                               f"if {backend}'s detection is wrong (not known here)")
        if backend == "ncclep":
            _add_ncclep(f, capacity_factor, tp, zero_copy)
        if mb.requires:
            f.notes.append(f"{backend} needs {mb.requires}")
        f.notes.append("recommended with flex: --moe-router-dtype fp32 (model.moe_router_dtype=fp32); "
                       "DeepEP/HybridEP take fp32 probs and cast otherwise")
        f.notes.append(SHARED_OVERLAP_019 if new else SHARED_OVERLAP_OLD)
    overlapped = overlap and _add_overlap(f, ep)
    f.bridge_perf = ["python", "scripts/performance/run_script.py", "...", "--moe_flex_dispatcher_backend",
                     backend if mb.flex else "None", "--moe_a2a_overlap", "true" if overlapped else "false"]
    f.bridge_perf += [f"-E {k}={v}" for k, v in f.env.items()]
    if not CHECKED_VERSIONS[0] <= parse_version(version) <= CHECKED_VERSIONS[1]:
        f.notes.append(f"megatron-core {version} is outside the checked range: these flags were checked against "
                       "megatron-core 0.16.1 and 0.19.2 only")
    return f


SHARED_OVERLAP_OLD = ("flex does not support --moe-shared-expert-overlap (megatron-core raises: alltoall only; Bridge "
                      "turns it off)")
SHARED_OVERLAP_019 = ("--moe-shared-expert-overlap is accepted with flex on megatron-core 0.19 (transformer_config: "
                      "alltoall or flex), but Megatron-Bridge's apply_flex_dispatcher_backend still turns it off")


def _add_ncclep(f: FlagSet, capacity_factor: float, tp: int, zero_copy: bool) -> None:
    """What megatron-core 0.19 with Transformer Engine needs for ncclep beyond the flags (read in core_v0.19.0
    fused_a2a.py / token_dispatcher.py / transformer_config.py and TE 2.17.1 / 2.18 / 2.19 pytorch/ep.py)."""
    f.megatron_lm += ["--moe-expert-rank-capacity-factor", f"{capacity_factor:g}"]
    f.megatron_bridge.append(f"model.moe_expert_rank_capacity_factor={capacity_factor:g}")
    if zero_copy:
        f.megatron_lm += [*ZERO_COPY_FLAGS]
        f.megatron_bridge += [f"model.{a[2:].replace('-', '_')}=true" for a in ZERO_COPY_FLAGS]
    f.notes += [
        f"capacity factor {capacity_factor:g}: each rank's receive budget is tokens (rounded up to 64) x top-k x TP "
        f"({tp}) x the factor rows; NCCL EP traps on overflow, so it must cover the busiest rank's (token, expert) "
        "rows",
        "bf16 payloads only: TE 2.18's ep.py accepts bfloat16 tokens (_require_bf16), so --fp16 stops at the first "
        "dispatch and fp8 dispatch is not offered",
        f"Transformer Engine {TE_FOR_NCCLEP} exactly: megatron-core 0.19's fused_a2a calls ep_dispatch(..., "
        "recv_tokens=, recv_topk_weights=) and ep_combine(..., grad_out=), which 2.17.1 lacks, and 2.19's "
        "ep_bootstrap requires num_topk, which 0.19 does not pass; TE must be built with NCCL EP (NVTE_WITH_NCCL_EP: "
        "its transformer_engine_torch carries ep_initialize), over NCCL >= 2.30.4",
        ZERO_COPY_NOTE if zero_copy else
        "timed without zero copy (zero_copy=0): no --moe-ncclep-static-shape / --moe-ncclep-zero-copy; then overlap "
        "(--overlap-moe-expert-parallel-comm) is serialized: each dispatch waits on a device-to-host copy of the "
        "counts"]


ZERO_COPY_FLAGS = ("--moe-ncclep-static-shape", "--moe-ncclep-zero-copy", "--moe-grouped-gemm",
                   "--use-transformer-engine-op-fuser")
ZERO_COPY_NOTE = ("timed as moebench's ncclep times it by default (zero_copy=1): the experts write into NCCL EP's "
                  "window-backed combine buffer, the counts stay on the device; megatron-core 0.19 requires "
                  "--moe-ncclep-static-shape for --moe-ncclep-zero-copy (ValueError otherwise), and static shape "
                  "requires --use-transformer-engine-op-fuser with --moe-grouped-gemm (with fp8/fp4 also an sm100+ GPU "
                  "and NVTE_CUTEDSL_FUSED_GROUPED_MLP=1); token_dispatcher.py _NCCLEPManager")


def check_parallelism(mb, ep: int | None, tp: int, domain: int | None, domain_found: int | None) -> None:
    """FlagsError where Megatron or HybridEP would reject the setting."""
    if mb.flex and ep is not None and tp * ep < 2:
        raise FlagsError(f"{mb.name} runs on Megatron's flex dispatcher, which needs TP x EP > 1 (Megatron asserts "
                         f"it): at TP {tp} x EP {ep} only alltoall applies")
    if not (mb.domain_env and domain):
        return
    if ep is not None and (tp * ep) % domain:
        raise FlagsError(f"{mb.domain_env}={domain} does not divide EP x TP = {tp * ep} (HybridEP needs it to)")
    if domain_found is not None and domain > domain_found:
        raise FlagsError(f"{mb.domain_env}={domain} exceeds the NVLink domain found: {domain_found} ranks")


def _add_overlap(f: FlagSet, ep: int | None) -> bool:
    if ep is not None and ep < 2:
        f.notes.append("overlap not emitted: overlap_moe_expert_parallel_comm needs EP > 1")
        return False
    f.megatron_lm += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    f.megatron_bridge += ["comm_overlap.overlap_moe_expert_parallel_comm=true",
                          "comm_overlap.delay_wgrad_compute=true", "model.moe_shared_expert_overlap=false"]
    f.env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
    f.notes.append("overlap needs EP > 1, bf16/fp16, no full recompute and no 'moe' recompute, "
                   "--moe-shared-expert-overlap off, VPP when PP > 1; set it under comm_overlap in Bridge "
                   "(CommOverlapConfig overwrites model.overlap_moe_expert_parallel_comm)")
    return True
