"""Hand-built frontiers with round numbers, so expected results can be worked out by hand."""

from __future__ import annotations

import numpy as np

from perseus.frontier import Frontier, FrontierPoint
from perseus.schedule import build_schedule


def hand_frontier(
    times=(1.0, 1.1, 1.25),
    energies=(90.0, 80.0, 75.0),
    baseline=(1.0, 100.0),
    p_blocking=10.0,
    stages=2,
    microbatches=2,
) -> Frontier:
    """Frontier of a ``stages`` x ``microbatches`` 1F1B pipeline with the given (time, energy) points."""
    schedule = build_schedule("1f1b", stages, microbatches)
    points = [
        FrontierPoint(t, e, np.full(schedule.num_instructions, 1400 - 100 * i, dtype=np.int64))
        for i, (t, e) in enumerate(zip(times, energies))
    ]
    return Frontier(schedule, p_blocking, baseline[0], baseline[1], points, gpu_name="hand")
