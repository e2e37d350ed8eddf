"""moebench backend -> Megatron-Core setting, as one table of data.

Backend names are Megatron's own values (`--moe-token-dispatcher-type alltoall`, or `flex` with
`--moe-flex-dispatcher-backend NAME`), and `mcore-NAME` is the same dispatcher run through
Megatron-Core's own classes. megatron/flags.py (A/B families, flags), megatron/tool.py (validate choices),
megatron/quick/train.py (which classes must have run), backends/mcore.py (config, import gate) and
checks/ep.py (does fused_a2a see the package) all read this table.

A new Megatron candidate is a row here, an `mcore-NAME` class in backends/mcore.py and its
registry line in backends/base.py (plus its raw backend, if moebench has one).
"""
from __future__ import annotations

from dataclasses import dataclass

MCORE_PREFIX = "mcore-"


@dataclass(frozen=True)
class MegatronBackend:
    name: str                                  # Megatron's value, and moebench's raw backend name
    dispatcher_type: str                       # --moe-token-dispatcher-type
    dispatcher_class: str                      # the token dispatcher class a training step must run
    manager_class: str | None = None           # the flex comm manager class
    package: str | None = None                 # module whose presence means Megatron should see it
    have_flag: str | None = None               # fused_a2a's flag: Megatron imported the package
    probe: tuple[tuple[str, str], ...] = ()    # (module, name) imports fused_a2a tries
    missing_hint: str = ""                     # why have_flag is False, and what to install
    default_sms: str | None = None             # Megatron's SM count when none is given
    domain_env: str | None = None              # env var for the GPUs per NVLink domain
    requires: str = ""                         # what Megatron needs beside the flags (said with them)
    since: tuple[int, int] = (0, 0)            # the first megatron-core minor version that has it
    has_mcore: bool = True                     # moebench runs it through Megatron-Core's classes (mcore-NAME)

    @property
    def flex(self) -> bool:
        return self.dispatcher_type == "flex"

    @property
    def mcore(self) -> str:
        """moebench's name for this dispatcher run through Megatron-Core's classes."""
        return MCORE_PREFIX + self.name


CONTROL = "alltoall"
BACKENDS = {b.name: b for b in (
    MegatronBackend("alltoall", "alltoall", "MoEAlltoAllTokenDispatcher"),
    MegatronBackend("deepep", "flex", "MoEFlexTokenDispatcher", "_DeepepManager", package="deep_ep",
                    have_flag="HAVE_DEEP_EP",
                    probe=(("deep_ep", "Buffer"), ("deep_ep.utils", "EventHandle"), ("deep_ep.utils", "EventOverlap")),
                    missing_hint="megatron-core could not import deep_ep.Buffer/EventOverlap (HAVE_DEEP_EP is False): "
                                 "install DeepEP v1.2.1 or its hybrid-ep branch (DeepEP v2 moved EventOverlap)",
                    default_sms="20"),
    MegatronBackend("hybridep", "flex", "MoEFlexTokenDispatcher", "_HybridEPManager", package="hybrid_ep_cpp",
                    have_flag="HAVE_HYBRIDEP", probe=(("deep_ep", "HybridEPBuffer"),),
                    missing_hint="megatron-core could not import deep_ep.HybridEPBuffer (HAVE_HYBRIDEP is False): "
                                 "install DeepEP's hybrid-ep branch",
                    default_sms="16 (0.16/0.17) or DeepEP's default (0.18+)",
                    domain_env="NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"),
    # no have_flag: fused_a2a reaches NCCL EP only through Transformer Engine (checked when it is asked for)
    MegatronBackend("ncclep", "flex", "MoEFlexTokenDispatcher", "_NCCLEPManager", package="transformer_engine",
                    since=(0, 19), has_mcore=False, default_sms="0: NCCL EP's own (high-throughput 16)",
                    requires="Transformer Engine 2.18 built with NCCL EP (transformer_engine.pytorch.ep; "
                             "NVTE_WITH_NCCL_EP, on by default for sm_90+) over NCCL >= 2.30.4, and "
                             "--moe-expert-rank-capacity-factor (Megatron asserts it: overflow traps, nothing is "
                             "dropped); TP x EP > 1"),
)}
NO_PATH = {  # moebench backends that no Megatron-Core release can run, and why (said instead of flags)
    "deepep-v2": "megatron-core (0.19 and before) has no path to DeepEP V2 (ElasticBuffer): its flex backends are deepep, hybridep "
                 "and ncclep; `deepepv2` exists only on Megatron-LM's dev branch (NVIDIA/Megatron-LM PR #4793)",
}
FLEX = tuple(n for n, b in BACKENDS.items() if b.flex)


def megatron_name(backend: str) -> str:
    """Megatron's value for a moebench backend name (`mcore-deepep` -> `deepep`)."""
    return backend.removeprefix(MCORE_PREFIX)


def families() -> dict[str, tuple[str, dict[str, str]]]:
    """A/B family -> (control record name, {candidate record name: Megatron backend}); the raw
    backends and the mcore-* ones are never mixed in one A/B."""
    cands = [b for b in BACKENDS.values() if b.name != CONTROL]
    return {"mcore": (BACKENDS[CONTROL].mcore, {b.mcore: b.name for b in cands if b.has_mcore}),
            "raw": (CONTROL, {b.name: b.name for b in cands})}
