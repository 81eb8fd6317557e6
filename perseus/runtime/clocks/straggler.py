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
pace has moved by more than ``recover_threshold`` the same way for ``patience`` consecutive
checks. A new target is the least change those checks support (the smallest of them going up,
the largest going down): one noisy window cannot push the target far. On a recorded noise trace
of this machine (``tests/data/straggler_noise.json``, docs/reliability.md) this cut the false
switches of following at once from 14 to 5 with checks every 5 steps and from 4 to 3 every 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from perseus.errors import ConfigError


def natural_time(measured_s: float, applied_ratio: float) -> float:
    """Iteration time this pipeline would take without the slowdown it applies on purpose."""
    return measured_s / applied_ratio


def pipeline_times(rank_times: Iterable[tuple[int, float]]) -> dict[int, float]:
    """(data-parallel index, natural time) per rank → each pipeline's time: its slowest rank's."""
    out: dict[int, float] = {}
    for dp, t in rank_times:
        out[dp] = max(out.get(dp, 0.0), t)
    return out


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
        self.reset()

    def reset(self) -> None:
        self.ratio = 1.0
        self._run: list[float] = []  # consecutive checks calling for a change, this direction
        self._direction = 0  # +1 slower, -1 faster (while active)
        self._below = 0

    @property
    def active(self) -> bool:
        return self.ratio > 1.0

    def observe(self, slowdown: float) -> float:
        """Feed one check's slowdown (slowest natural time / own natural time); returns the ratio."""
        excess = slowdown - 1.0
        if not self.active:
            self._run = self._run + [slowdown] if excess > self.threshold else []
            if len(self._run) >= self.patience:
                self._switch(min(self._run[-self.patience:]))
            return self.ratio
        self._below = self._below + 1 if excess < self.recover_threshold else 0
        if self._below >= self.patience:
            self._switch(1.0)
            return self.ratio
        moved = 0 if excess < self.recover_threshold or abs(slowdown / self.ratio - 1.0) <= self.recover_threshold \
            else (1 if slowdown > self.ratio else -1)
        self._run = self._run + [slowdown] if moved and moved == self._direction else ([slowdown] if moved else [])
        self._direction = moved
        if len(self._run) >= self.patience:
            recent = self._run[-self.patience:]
            self._switch(min(recent) if moved > 0 else max(recent))
        return self.ratio

    def _switch(self, ratio: float) -> None:
        self.ratio, self._run, self._direction, self._below = ratio, [], 0, 0
