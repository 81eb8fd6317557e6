"""The profiling clock sweep: which SM clocks the online profiler visits, in what order, and when
it stops early. ("Sweep" in Perseus means this and only this; the planner searches deadlines.)

The sweep goes from the highest clock downward, ``iters_per_freq`` training iterations per clock,
right after the warm-up steps. Cost in iterations, without early stop:

    profiling_iterations = warmup_steps + iters_per_freq × len(frequencies)

Early stop: below some clock, running slower only costs energy (static power dominates). When
every instruction kind got more expensive at ``patience`` consecutive clocks, the lower clocks
cannot be on the frontier and the sweep ends there.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from perseus.errors import ConfigError


def select_frequencies(
    supported_mhz: Sequence[int],
    freq_min_mhz: int | None = None,
    freq_max_mhz: int | None = None,
    step_mhz: int | None = None,
    every_k: int = 1,
) -> list[int]:
    """Clocks to sweep, highest first: the supported ones in range, thinned by step or every k-th."""
    supported = sorted({int(f) for f in supported_mhz}, reverse=True)
    if not supported:
        raise ConfigError("the GPU reports no supported SM clocks; cannot profile (use mode 'measure-only')")
    lo = freq_min_mhz if freq_min_mhz is not None else supported[-1]
    hi = freq_max_mhz if freq_max_mhz is not None else supported[0]
    in_range = [f for f in supported if lo <= f <= hi]
    if not in_range:
        raise ConfigError(
            f"no supported SM clock in freq_min_mhz..freq_max_mhz = {lo}..{hi} MHz; "
            f"this GPU supports {supported[-1]}..{supported[0]} MHz"
        )
    if step_mhz is not None:
        chosen = [in_range[0]]
        for f in in_range[1:]:
            if chosen[-1] - f >= step_mhz:
                chosen.append(f)
        return chosen
    return in_range[::every_k]


def profiling_iterations(warmup_steps: int, iters_per_freq: int, num_frequencies: int) -> int:
    """Training iterations spent before planning starts when the sweep runs to the end."""
    return warmup_steps + iters_per_freq * num_frequencies


class ClockSweep:
    """Walks the clock list; ``done`` once the list is exhausted or energy keeps rising."""

    def __init__(self, frequencies_mhz: Sequence[int], iters_per_freq: int, patience: int = 2) -> None:
        if not frequencies_mhz:
            raise ConfigError("frequency sweep needs at least one clock")
        self.frequencies = list(frequencies_mhz)
        self.iters_per_freq = iters_per_freq
        self.patience = patience
        self.index = 0
        self.iters_done = 0
        self.rising_streak = 0
        self.stopped_early = False
        self.visited: list[int] = []

    @property
    def done(self) -> bool:
        return self.index >= len(self.frequencies)

    @property
    def current_mhz(self) -> int:
        return self.frequencies[self.index]

    def count_iteration(self) -> bool:
        """Count one measured iteration at the current clock; True when this clock is complete."""
        self.iters_done += 1
        return self.iters_done >= self.iters_per_freq

    def next_frequency(self, rising_everywhere: bool) -> int | None:
        """Move past the current clock; returns the next clock or None when the sweep is over.

        ``rising_everywhere``: every instruction kind on every rank used more energy at the clock
        just finished than at the one before (the engine agrees on it across ranks).
        """
        self.rising_streak = self.rising_streak + 1 if rising_everywhere else 0
        self.visited.append(self.current_mhz)
        self.index += 1
        self.iters_done = 0
        if self.patience and self.rising_streak >= self.patience and not self.done:
            self.stopped_early = True
            self.index = len(self.frequencies)
        return None if self.done else self.current_mhz


def energy_rose(previous: Mapping[object, float] | None, current: Mapping[object, float]) -> bool:
    """True when every key's energy is higher now than at the previous clock."""
    if not previous or not current:
        return False
    return all(key in previous and current[key] > previous[key] for key in current)
