"""A picklable, JSON-able description of which GPU to open.

The controller process cannot inherit a device object (NVML handles and mmaps don't cross
``exec``), so it receives this spec and opens its own device with ``factory.open_spec``. The spec
is plain data and imports no backend: the backends import it, so it must not import them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GPUSpec:
    """``kind`` is "nvml" or "sim"; ``index`` as for ``open_gpu``; ``sim`` holds SimulatedGPU kwargs;
    ``zeusd_socket``: privileged calls and energy go through the zeusd serving that socket ("": none).
    A zeusd token is never part of the spec (it would show on the controller's command line): the
    controller process inherits ``$ZEUSD_TOKEN``."""

    kind: str
    index: int | None = None
    sim: dict[str, Any] = field(default_factory=dict)
    zeusd_socket: str = ""

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "index": self.index, "sim": self.sim, "zeusd_socket": self.zeusd_socket},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GPUSpec:
        d = json.loads(text)
        return cls(kind=d["kind"], index=d.get("index"), sim=dict(d.get("sim") or {}),
                   zeusd_socket=str(d.get("zeusd_socket") or ""))
