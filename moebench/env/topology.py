"""GPU inventory through NVML (nvidia-ml-py), with torch as a fallback. Absent NVML or GPU is
not an error: the fields are None and callers decide (WAIVED, nominal ceilings only, ...)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GPU:
    index: int
    name: str
    memory_GiB: float | None = None
    nvlinks_up: int | None = None      # None: NVML cannot tell (e.g. "Not Supported")
    numa_node: int | None = None


@dataclass
class Inventory:
    gpus: list[GPU] = field(default_factory=list)
    source: str = "none"
    error: str = ""

    def asdict(self) -> dict:
        return asdict(self)


def nvml():
    """The initialised pynvml module; raises with the reason when NVML cannot be used."""
    import pynvml
    pynvml.nvmlInit()
    return pynvml


def nvlinks_up(pynvml, handle) -> int | None:
    up, supported = 0, False
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            continue
        supported = True
        up += int(state == pynvml.NVML_FEATURE_ENABLED)
    return up if supported else None


def inventory() -> Inventory:
    try:
        nv = nvml()
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h).total / 2**30
            gpus.append(GPU(i, name.decode() if isinstance(name, bytes) else name, round(mem, 1),
                            nvlinks_up(nv, h)))
        return Inventory(gpus, "nvml")
    except Exception as e:  # noqa: BLE001 - NVML missing or no driver
        err = f"{type(e).__name__}: {e}"
    try:
        import torch
        if torch.cuda.is_available():
            gpus = [GPU(i, torch.cuda.get_device_name(i),
                        round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1))
                    for i in range(torch.cuda.device_count())]
            return Inventory(gpus, "torch", err)
    except Exception as e:  # noqa: BLE001
        err += f"; torch: {e}"
    return Inventory([], "none", err)
