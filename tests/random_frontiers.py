"""Small frontiers with random clocks, for tests of the frontier's file and wire forms.

Random clocks per instruction are the worst case for compact encodings, and times and energies
are awkward floats, so a round trip that is not exact shows. Shared by tests/core (the file) and
tests/runtime (a stage's slice on the wire).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perseus.frontier import Frontier, FrontierPoint
from perseus.schedules import build_schedule


def random_frontier(schedule_args: tuple = ("interleaved", 4, 8, 2), num_points: int = 40, num_paced: int = 7, *,
                    clocks: Any = None, paced_energy_j: float = 900.0, baseline: tuple[float, float] = (1.0 + 1e-9, 1000.0 / 3),
                    seed: int = 0, **fields: Any) -> Frontier:
    """Points at random times in [1, 2] s with energy ~1000/t; paced points ~``paced_energy_j``
    (low enough, e.g. 560 J at 4 stages, and ``paced_lookup`` picks them). ``fields``: the
    ``Frontier``'s other fields (``solve_time_s``, ``metadata``)."""
    rng = np.random.default_rng(seed)
    schedule = build_schedule(*schedule_args)
    clocks = np.arange(600, 1411, 15) if clocks is None else np.asarray(clocks)
    n = schedule.num_instructions

    def point(t: float, e: float) -> FrontierPoint:
        return FrontierPoint(t, e, rng.choice(clocks, n).astype(np.int64))

    times = np.sort(rng.uniform(1.0, 2.0, num_points + num_paced))
    points = [point(float(t), 1000.0 / float(t) + rng.random() / 3) for t in times[:num_points]]
    paced = [point(float(t), paced_energy_j + rng.random() / 7) for t in times[num_points:]]
    return Frontier(schedule, 83.64, baseline[0], baseline[1], points, gpu_name="H100 SXM", paced_points=paced,
                    **fields)
