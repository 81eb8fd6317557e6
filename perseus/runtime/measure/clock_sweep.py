"""The profiling clock sweep: which SM clocks the online profiler visits, in what order, and when
it stops. ("Sweep" in Perseus means this and only this; the planner searches deadlines.)

Coarse to fine, from the sustained clock downward, ``iters_per_freq`` training iterations per clock.
The sweep starts at ``start_mhz``: the highest clock any stage's unlocked GPU sustained under its
load in warm-up (``sustained.py``; the top candidate where a rank could not tell). Clocks above
it are not profiled: locking them changes nothing, the card throttles back (``skipped``; the
profile records them equal to the sustained clock's point). Each stage's own sustained clock is
an ``anchor``: measured even where the coarse pass would skip it, and kept by an early stop.

1. **Coarse**: the candidate clocks (``select_frequencies``) thinned to ``coarse_step_mhz`` apart.
   Below some clock running slower only costs energy (static power dominates): once every
   instruction kind on every rank stopped getting cheaper (no new energy minimum) at ``patience``
   consecutive clocks, lower clocks cannot be on the frontier and the pass ends there.
2. **Refine**: the profiler checks, at each measured clock, whether its neighbours predict it
   (``perseus.profile.fit.loo_errors``); where they do not, it asks for the clock between them
   (``add_refinements``), at most ``refine_max`` clocks in all.

The clocks in between are interpolated at aggregation where the model was validated. Each clock
may be re-measured (``extend``) when its noise is larger than the effect being measured. Cost:

    profiling_iterations = warmup_steps + iterations spent at the visited clocks

The sweep's state is plain data (``state``/``restore``), so a run that ends while profiling
leaves it with the measurements and the next run resumes (docs/runtime.md).
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence, TypeVar

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
        return thin(in_range, step_mhz)
    return in_range[::every_k]


def thin(freqs_desc: Sequence[int], step_mhz: int | None) -> list[int]:
    """Highest first, each at least ``step_mhz`` below the previous (all of them when None)."""
    if not freqs_desc:
        return []
    if not step_mhz:
        return list(freqs_desc)
    chosen = [freqs_desc[0]]
    for f in freqs_desc[1:]:
        if chosen[-1] - f >= step_mhz:
            chosen.append(f)
    return chosen


def profiling_iterations(warmup_steps: int, iters_per_freq: int, num_frequencies: int) -> int:
    """Training iterations spent before planning starts when every clock takes ``iters_per_freq``."""
    return warmup_steps + iters_per_freq * num_frequencies


def between(candidates: Sequence[int], hi: int, lo: int) -> int | None:
    """The candidate clock nearest the middle of (lo, hi), strictly inside; None when none is."""
    inside = [f for f in candidates if lo < f < hi]
    if not inside:
        return None
    mid = (hi + lo) / 2
    return min(inside, key=lambda f: (abs(f - mid), -f))


class ClockSweep:
    """Walks the clocks; ``done`` once the coarse pass stopped and no refinement is pending."""

    def __init__(self, frequencies_mhz: Sequence[int], iters_per_freq: int, patience: int = 2,
                 coarse_step_mhz: int | None = None, refine_max: int = 0, start_mhz: int | None = None,
                 anchors: Sequence[int] = ()) -> None:
        if not frequencies_mhz:
            raise ConfigError("frequency sweep needs at least one clock")
        # the candidates and anchors, highest first: the profile's grid
        self.frequencies = sorted({int(f) for f in frequencies_mhz} | {int(f) for f in anchors}, reverse=True)
        self.start_mhz = self.frequencies[0] if start_mhz is None else int(start_mhz)
        self.anchors = sorted({int(f) for f in anchors if f <= self.start_mhz}, reverse=True)
        self.skipped = [f for f in self.frequencies if f > self.start_mhz]  # not profiled: equal to the sustained clock
        below = [f for f in self.frequencies if f <= self.start_mhz]
        self.coarse = sorted(set(thin(below, coarse_step_mhz)) | set(self.anchors), reverse=True)
        self.iters_per_freq = iters_per_freq
        self.patience = patience
        self.refine_max = refine_max
        self.queue: list[int] = list(self.coarse)
        self.refining = False
        self.refined: list[int] = []
        self.iters_done = 0
        self.iters_target = iters_per_freq
        self.iterations = 0  # all iterations spent profiling (re-measured ones included)
        self.remeasured = 0
        self.rising_streak = 0
        self.stopped_early = False
        self.visited: list[int] = []

    @property
    def done(self) -> bool:
        return not self.queue

    @property
    def current_mhz(self) -> int:
        return self.queue[0]

    @property
    def first_iteration(self) -> bool:
        """The next iteration is the first at a newly set clock."""
        return self.iters_done == 0

    def count_iteration(self) -> bool:
        """Count one measured iteration at the current clock; True when this clock is complete."""
        self.iters_done += 1
        self.iterations += 1
        return self.iters_done >= self.iters_target

    def extend(self, iterations: int) -> None:
        """Measure the current clock for ``iterations`` more (noise larger than the effect)."""
        self.iters_target += iterations
        self.remeasured += 1

    def lengthen(self, iterations: int) -> None:
        """Measure the current clock for ``iterations`` more (too few energy-counter intervals)."""
        self.iters_target += iterations

    def next_frequency(self, stopped_falling: bool) -> int | None:
        """Move past the current clock; returns the next clock or None when the sweep is over.

        ``stopped_falling``: no instruction kind on any rank got cheaper at the clock just
        finished (the ranks agree on it); only counts in the coarse pass.
        """
        self.visited.append(self.queue.pop(0))
        self.iters_done, self.iters_target = 0, self.iters_per_freq
        if not self.refining:
            self.rising_streak = self.rising_streak + 1 if stopped_falling else 0
            if self.patience and self.rising_streak >= self.patience and self.queue:
                self.stopped_early = True
                self.queue = [f for f in self.queue if f in self.anchors]  # a stage's sustained clock stays
            if not self.queue:
                self.refining = True
        return None if self.done else self.current_mhz

    def refinement_candidates(self, failing: Sequence[int]) -> list[int]:
        """Clocks that would split the intervals around each failing measured clock."""
        measured = sorted(set(self.visited), reverse=True)
        out: set[int] = set()
        for f in failing:
            if f not in measured:
                continue
            i = measured.index(f)
            for hi, lo in ((measured[i - 1] if i > 0 else None, f), (f, measured[i + 1] if i + 1 < len(measured) else None)):
                if hi is not None and lo is not None:
                    mid = between(self.frequencies, hi, lo)
                    if mid is not None:
                        out.add(mid)
        return sorted(out - set(self.visited), reverse=True)

    def add_refinements(self, clocks: Sequence[int]) -> list[int]:
        """Queue refinement clocks (highest first) within the remaining budget; returns them."""
        room = self.refine_max - len(self.refined)
        new = [f for f in sorted(set(clocks), reverse=True) if f not in self.visited and f not in self.queue][:max(room, 0)]
        self.refined.extend(new)
        self.queue = sorted(self.queue + new, reverse=True)
        return new

    # ------------------------------------------------------------------ resume

    def state(self) -> dict[str, Any]:
        """Plain data: what a later run needs to continue this sweep."""
        return {"visited": list(self.visited), "queue": list(self.queue), "refining": self.refining,
                "refined": list(self.refined), "rising_streak": self.rising_streak,
                "stopped_early": self.stopped_early, "remeasured": self.remeasured}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state()`` of an earlier run (its clocks count as visited, not as spent)."""
        self.visited = [int(f) for f in state["visited"]]
        self.queue = [int(f) for f in state["queue"]]
        self.refining = bool(state["refining"])
        self.refined = [int(f) for f in state["refined"]]
        self.rising_streak = int(state["rising_streak"])
        self.stopped_early = bool(state["stopped_early"])
        self.remeasured = int(state.get("remeasured", 0))
        self.iters_done, self.iters_target = 0, self.iters_per_freq


K = TypeVar("K", bound=Hashable)


def energy_rose(previous: Mapping[K, float] | None, current: Mapping[K, float]) -> bool:
    """True when every key's energy is higher now than at the previous clock."""
    if not previous or not current:
        return False
    return all(key in previous and current[key] > previous[key] for key in current)


def energy_stopped_falling(lowest: Mapping[K, float] | None, current: Mapping[K, float]) -> bool:
    """True when no key's energy is below its lowest at the clocks before (no new minimum)."""
    if not lowest or not current:
        return False
    return all(key in lowest and current[key] >= lowest[key] for key in current)
