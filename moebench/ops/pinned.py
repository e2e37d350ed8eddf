"""Pinned int32 rows on the host that a kernel writes directly (pinned memory is mapped into the GPU's
address space), handed out in turn, each with a CUDA event: the host waits for the kernel that wrote a
row, never for a device-to-host copy or a side stream (those cost more host time than the kernels).
One ring per device, made on first use; both the CUDA and the Triton permute take their rows here."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class Row(NamedTuple):
    host: torch.Tensor        # the ring's whole pinned tensor (a kernel is given it and `offset`)
    offset: int               # this row's first element in `host`
    view: np.ndarray          # the row, read on the host once `event` has passed
    event: torch.cuda.Event   # recorded by the caller after the kernel that writes the row


class PinnedRing:
    def __init__(self, slots: int, width: int, fill: int = 0):
        self.slots, self.width, self.fill = slots, width, fill
        self._rings: dict = {}

    def take(self, dev: torch.device) -> Row:
        ring = self._rings.get(dev)
        if ring is None:
            host = torch.full((self.slots * self.width,), self.fill, dtype=torch.int32, pin_memory=True)
            view = host.numpy()
            rows = [Row(host, i * self.width, view[i * self.width:(i + 1) * self.width], torch.cuda.Event())
                    for i in range(self.slots)]
            ring = self._rings[dev] = [rows, 0]
        rows, n = ring
        ring[1] = n + 1
        return rows[n % self.slots]
