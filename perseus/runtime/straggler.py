"""Straggler policy: when should a data-parallel pipeline slow down to match a slower one?

Extrinsic energy bloat: data-parallel pipelines synchronize every iteration, so when one pipeline
is slow (thermal throttling, a bad node) every other pipeline finishes early and waits. Slowing
the others to the straggler's pace costs no time and saves energy. This module is the pure
decision rule; the engine feeds it numbers gathered every K steps and applies the answer.

Pipelines report *natural* times: measured time divided by the slowdown they currently apply on
purpose (``natural_time``). Without that, a pipeline that slowed down to match the straggler
would look slow itself, the straggler would disappear from view, everyone would speed up again,
and the policy would flap.

Hysteresis: a slowdown is adopted only after ``patience`` consecutive checks above
``threshold`` and dropped only after ``patience`` consecutive checks below
``recover_threshold`` (< threshold). While active, the target follows the straggler when its
pace changes by more than ``recover_threshold``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from perseus.errors import ConfigError


def natural_time(measured_s: float, applied_ratio: float) -> float:
    """Iteration time this pipeline would take without the slowdown it applies on purpose."""
    return measured_s / applied_ratio


def slowdown_against_slowest(natural_times_s: Sequence[float], own_index: int) -> float:
    """How much slower (ratio ≥ 1) the slowest pipeline is than this one."""
    own = natural_times_s[own_index]
    if own <= 0:
        return 1.0
    return max(1.0, max(natural_times_s) / own)


@dataclass
class StragglerPolicy:
    """Slowdown ratio to apply, from a series of observed slowdowns of the slowest pipeline."""

    threshold: float = 0.05
    recover_threshold: float = 0.02
    patience: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.recover_threshold < self.threshold:
            raise ConfigError(
                f"straggler thresholds: need 0 <= recover ({self.recover_threshold}) < threshold ({self.threshold})"
            )
        if self.patience < 1:
            raise ConfigError(f"straggler patience must be >= 1, got {self.patience}")
        self.ratio = 1.0
        self._above = 0
        self._below = 0

    @property
    def active(self) -> bool:
        return self.ratio > 1.0

    def observe(self, slowdown: float) -> float:
        """Feed one check's slowdown (slowest natural time / own natural time); returns the ratio."""
        excess = slowdown - 1.0
        if not self.active:
            self._above = self._above + 1 if excess > self.threshold else 0
            if self._above >= self.patience:
                self.ratio, self._above, self._below = slowdown, 0, 0
            return self.ratio
        self._below = self._below + 1 if excess < self.recover_threshold else 0
        if self._below >= self.patience:
            self.ratio, self._above, self._below = 1.0, 0, 0
        elif excess >= self.recover_threshold and abs(slowdown / self.ratio - 1.0) > self.recover_threshold:
            self.ratio = slowdown
        return self.ratio

    def reset(self) -> None:
        self.ratio, self._above, self._below = 1.0, 0, 0
