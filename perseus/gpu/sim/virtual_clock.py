"""``VirtualClock``: time that passes only when slept, for deterministic single-process tests.

Pass ``clock=vc.now, sleep=vc.sleep`` to a ``SimulatedGPU``: its kernels then take their simulated
durations exactly, with no wall-clock wait and no scheduling noise.
"""

from __future__ import annotations


class VirtualClock:
    """A manual clock for deterministic single-process tests: ``sleep`` advances time instantly."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += max(0.0, dt)
