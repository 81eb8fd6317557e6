"""Replaying the straggler policy on a recorded trace of iteration times.

The trace (``tests/data/straggler_noise.json``, written by ``benchmarks/bench_straggler_noise.py
--record``) holds every rank's iteration times from a toy run on the shared 2-core machine with
no straggler: every slowdown the policy adopts on it is a false switch. The replay computes
what the periodic job check computes (``job_check.check_job``: each rank's median over a window
of K steps, each pipeline's slowest rank, the slowest pipeline against one's own) and feeds it
to ``StragglerPolicy``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from perseus.runtime.clocks.straggler import StragglerPolicy, pipeline_times, slowdown_against_slowest

TRACE = Path(__file__).parents[1] / "data" / "straggler_noise.json"


def load_trace(path: Path = TRACE) -> dict:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Replay:
    checks: int  # policy decisions per pipeline
    switches: dict[int, int]  # per pipeline: times its slowdown ratio changed (all false here)
    slowdowns: dict[int, list[float]]  # per pipeline: what each check observed

    @property
    def rate(self) -> float:
        """False switches per check, over all pipelines."""
        return sum(self.switches.values()) / max(1, self.checks * len(self.switches))


def replay(trace: dict, period: int, threshold: float, recover: float, patience: int) -> Replay:
    stages = trace["num_stages"]
    times = {int(r): t for r, t in trace["step_ms"].items()}
    n = min(len(t) for t in times.values())
    dps = sorted({r // stages for r in times})
    policies = {dp: StragglerPolicy(threshold, recover, patience) for dp in dps}
    switches = {dp: 0 for dp in dps}
    seen: dict[int, list[float]] = {dp: [] for dp in dps}
    checks = 0
    for start in range(0, n - period + 1, period):
        checks += 1
        # natural time: the trace ran the default point (no deliberate slowdown), so measured time
        rows = [(r // stages, median(t[start:start + period])) for r, t in sorted(times.items())]
        pipes = pipeline_times(rows)
        order = sorted(pipes)
        for dp in dps:
            slowdown = slowdown_against_slowest([pipes[d] for d in order], order.index(dp))
            seen[dp].append(slowdown)
            before = policies[dp].ratio
            if policies[dp].observe(slowdown) != before:
                switches[dp] += 1
    return Replay(checks, switches, seen)
