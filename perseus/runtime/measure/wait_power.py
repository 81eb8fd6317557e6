"""P_blocking from the stage's own pipeline waits, measured while it profiles.

Why: the planner bills every wait of a stage at P_blocking. Measured with a gloo receive on an
idle GPU (``profiling_run.measure_p_blocking``) that is the idle power, but a real pipeline stage
waiting for its peer runs NCCL's receive or send kernel, which spins well above idle (the simulated
H200's ``spin_activity``: about 165 W against 110 W idle at its top clock), so the bubbles a plan
leaves were billed too low. Here the waits are the gaps between a profiled step's instructions on
the GPU's clock (the real schedule's sends and receives; not the step's work between steps), and
their power is the energy counter's over the stretches of them between two counter updates: the
counter's own resolution, nothing interpolated across a kernel. Where the waits hold fewer than
``MIN_INTERVALS`` such stretches (a 100 ms counter needs waits over 200 ms), the gloo measurement
stands, and the profile's notes say which was used (``WAITS``, ``GLOO``, ``CONFIGURED``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from perseus.gpu.meter.energy import CounterUpdate
from perseus.gpu.meter.timing import TimedInstruction
from perseus.gpu.stream.gpu_time import NON_INSTRUCTION

MIN_INTERVALS = 3  # counter intervals inside waits before their power replaces the gloo measurement
# How each rank's P_blocking was found: the profile's ``notes["p_blocking_source"]`` joins these.
WAITS = "the pipeline's own waits"
GLOO = ("the separate measurement on an idle GPU (a gloo receive; idle power for a rank alone): no pipeline "
        "wait spanned enough energy-counter updates")
CONFIGURED = "configured (p_blocking_w)"


class WaitPower:
    """The waits of the profiled steps so far, and their power from the counter's updates."""

    def __init__(self) -> None:
        self.waits: list[tuple[float, float]] = []

    def add_step(self, timed: Sequence[TimedInstruction]) -> None:
        """A profiled step's instructions (GPU times): the gaps between consecutive ones are waits."""
        spans = sorted((t.start_s, t.end_s) for t in timed if t.key != NON_INSTRUCTION)
        last_end = None
        for start, end in spans:
            if last_end is not None and start > last_end:
                self.waits.append((last_end, start))
            last_end = end if last_end is None else max(last_end, end)

    def power_w(self, updates: Sequence[CounterUpdate]) -> tuple[float, float] | None:
        """(watts, seconds measured) over every stretch of a wait between two counter updates;
        None with fewer than ``MIN_INTERVALS`` of them."""
        times = [u.t_s for u in updates]
        energy = seconds = 0.0
        intervals = 0
        for a, b in self.waits:
            lo, hi = bisect.bisect_left(times, a), bisect.bisect_right(times, b)
            if hi - lo >= 2:
                energy += updates[hi - 1].energy_j - updates[lo].energy_j
                seconds += times[hi - 1] - times[lo]
                intervals += hi - lo - 1
        if intervals < MIN_INTERVALS or seconds <= 0 or energy <= 0:
            return None
        return energy / seconds, seconds


def source_note(sources: Sequence[str]) -> str:
    """The profile's note on P_blocking from every rank's source: one, or each with its ranks' count."""
    distinct = sorted(set(sources))
    if len(distinct) == 1:
        return distinct[0]
    return "; ".join(f"{sum(s == d for s in sources)} rank(s): {d}" for d in distinct)
