"""What the card said about its clock during probes and plan steps: the clock-event reasons.

Why: a probe at default clocks after cooler plan steps has thermal and power headroom that
sustained default clocks do not (issue 34: the H200 sustains 1,410-1,620 MHz under dense bf16
load, power-capped), so a probe can be optimistic. Whether it was shows in the reasons the device
reports while it runs (``sw_power_cap``, ``hw_thermal_slowdown``, ...): a probe block that never
reports the power cap the plan steps around it do was not run at the sustained clock.

The reasons are read where the device is read anyway, on the energy poller's thread (never on the
training thread): the GPU port answers ``clock_reasons_since`` from the poller's samples (a
``ClockReasonSource``). This module only tallies, per kind of step, how many steps reported each
reason; the guard's events and the summary carry the shares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from perseus.gpu.device import ClockEventReason


@runtime_checkable
class ClockReasonSource(Protocol):
    """The reasons the device reported from ``t_s`` (CLOCK_MONOTONIC) on, from samples taken off the
    training thread (``GPUPort.clock_reasons_since``)."""

    def clock_reasons_since(self, t_s: float) -> frozenset[ClockEventReason]: ...


@dataclass
class ReasonTally:
    """Steps of one kind and how many of them reported each reason."""

    steps: int = 0
    counts: Counter[ClockEventReason] = field(default_factory=Counter)

    def add(self, reasons: frozenset[ClockEventReason]) -> None:
        self.steps += 1
        self.counts.update(reasons)

    def shares(self) -> dict[str, float]:
        """Each reason reported: the share of the steps that reported it (by NVML's name)."""
        return {r.value: n / self.steps for r, n in sorted(self.counts.items(), key=lambda rn: rn[0].value)}


@dataclass
class ProbeReasons:
    """Probe steps' and plan steps' reasons (counted steps of each; module docstring)."""

    probe: ReasonTally = field(default_factory=ReasonTally)
    plan: ReasonTally = field(default_factory=ReasonTally)

    def add(self, probe: bool, reasons: frozenset[ClockEventReason]) -> None:
        (self.probe if probe else self.plan).add(reasons)

    def as_dict(self) -> dict[str, object]:
        return {"probe_steps": self.probe.steps, "probe": self.probe.shares(),
                "plan_steps": self.plan.steps, "plan": self.plan.shares()}
