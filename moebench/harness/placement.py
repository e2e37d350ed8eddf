"""Where a run's ranks go, decided once for every tool (dispatch, check, megatron): the device, how many
ranks share a GPU, the GPUs that needs, whether its times are functional only, and what to tell the user.

Rules: needing more GPUs than are visible is an error only when cuda was asked for (auto falls back to
CPU/gloo and the note says so); shared-GPU ranks (ranks_per_gpu > 1: N rank processes on one GPU, gloo
group, CUDA IPC) need ceil(ranks / N) GPUs and always run on cuda; under torchrun or srun the launcher's
world is the ranks, one process per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.workload import WorkloadError


class PlacementError(WorkloadError):
    """A placement this machine cannot give: one line, exit 2."""


@dataclass(frozen=True)
class Placement:
    device: str                 # cuda | cpu
    ranks: int
    ranks_per_gpu: int = 1
    note: str = ""              # what the user should be told (a CPU fallback, shared-GPU ranks)

    @property
    def gpus_needed(self) -> int:
        return -(-self.ranks // self.ranks_per_gpu) if self.device == "cuda" else 0

    @property
    def shared_gpu(self) -> bool:
        return self.ranks_per_gpu > 1

    @property
    def functional(self) -> bool:
        """Times that say the code works, not how fast: CPU/gloo, or ranks time-slicing a GPU."""
        return self.device == "cpu" or self.shared_gpu


def visible_gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def place(requested: str, ranks: int, ranks_per_gpu: int = 1, joined: tuple | None = None,
          ngpu: int | None = None) -> Placement:
    """requested: auto | cuda | cpu; joined: (rank, world, local_rank) under torchrun / srun."""
    ngpu = visible_gpus() if ngpu is None else ngpu
    if ranks_per_gpu < 1:
        raise PlacementError(f"--ranks-per-gpu must be >= 1, got {ranks_per_gpu}")
    need = -(-ranks // ranks_per_gpu)
    if ranks_per_gpu > 1:
        if requested == "cpu" or ngpu == 0:
            raise PlacementError(f"--ranks-per-gpu {ranks_per_gpu} shares GPUs between ranks, but "
                                 f"{'--device cpu was asked for' if requested == 'cpu' else 'no GPU is visible'}")
        if need > ngpu and joined is None:
            raise PlacementError(f"--ep {ranks} with --ranks-per-gpu {ranks_per_gpu} needs {need} GPUs but {ngpu} "
                                 "are visible")
        return Placement("cuda", ranks, ranks_per_gpu, f"{ranks} ranks sharing {need} GPU(s) ({ranks_per_gpu} per "
                                                       "GPU, gloo group): functional only, NOT performance figures")
    if joined is not None:
        if joined[1] != ranks:
            raise PlacementError(f"--ep {ranks} but the launcher started {joined[1]} processes; they must match")
        return Placement("cpu" if requested == "cpu" or not ngpu else "cuda", ranks)
    if requested == "cuda" and ngpu < need:
        raise PlacementError(f"--ep {ranks} needs {need} GPUs but {ngpu} are visible; use --device cpu for a functional "
                             "CPU run, --ranks-per-gpu N to share GPUs (functional only), or launch with torchrun/srun "
                             "across nodes (one process per GPU)")
    if requested in ("auto", "cuda") and ngpu >= need:
        return Placement("cuda", ranks)
    note = "" if requested == "cpu" else f"EP {ranks} > {ngpu} visible GPUs: "
    return Placement("cpu", ranks, 1, note + "running on CPU/gloo: CPU times are functional only, NOT performance "
                                            "figures")


def for_roundtrip(ngpu: int, sizes=None) -> Placement:
    """A check's round trip: one rank per visible GPU where the backend takes that many (`sizes`; None: any
    2+), else 2 ranks sharing GPU 0, else, with no GPU, 2 CPU ranks (the buffer construction is still tried,
    so a build that crashes there is found on any machine)."""
    if ngpu >= 2 and (sizes is None or ngpu in sizes):
        return Placement("cuda", ngpu)
    if ngpu >= 1:
        return Placement("cuda", 2, 2, "2 ranks sharing GPU 0: functional only")
    return Placement("cpu", 2, 1, "on CPU (no GPU visible)")
