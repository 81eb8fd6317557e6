"""A picklable, JSON-able description of which GPU to open.

The controller process cannot inherit a device object (NVML handles and mmaps don't cross
``exec``), so it receives this spec and opens its own device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.gpu.device import GPUDevice


@dataclass(frozen=True)
class GPUSpec:
    """``kind`` is "nvml" or "sim"; ``index`` as for ``open_gpu``; ``sim`` holds SimulatedGPU kwargs."""

    kind: str
    index: int | None = None
    sim: dict[str, Any] = field(default_factory=dict)

    def open(self) -> GPUDevice:
        """Open the device this spec describes (attaching, for a simulated GPU)."""
        from perseus.gpu.factory import open_gpu

        return open_gpu(self.kind, self.index, **self.sim)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "index": self.index, "sim": self.sim}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GPUSpec:
        d = json.loads(text)
        return cls(kind=d["kind"], index=d.get("index"), sim=dict(d.get("sim") or {}))
