#!/usr/bin/env python
"""The no-slowdown guard's error rates and probe cost, by simulation (no GPU, no timing of this machine).

    python benchmarks/bench_guard.py            # the table docs/runtime.md quotes
    python benchmarks/bench_guard.py --runs 10  # quicker, coarser

Each row drives the guard exactly as the closed loop does (``perseus.runtime.guard.simulation``: seeded
probe placement, windows, the rank-score CUSUM, its backoff) over synthetic deployed runs:
multiplicative step noise (log-normal 1 % as on a GPU, 3 %, or replayed from the recorded noise of
this loaded 2-core machine, ``tests/data/straggler_noise.json``, about 8 % robust spread with
tails to 3×), periodic host work of 30 % of a step every ``period`` steps, and the first step after
each clock change 30 % slower. Columns:

- ``false alarms / 10k``: alarms per 10,000 deployed steps of an honest plan (as fast as default
  clocks), the test restarted after each; ``probes``: the share of deployed steps at default
  clocks over the whole run and over its second half (after confidence).
- ``10 % slower`` / ``3 % slower``: deployed steps to the alarm (median and 90th percentile, ``-``
  when more than a tenth of runs never alarmed within 2,000 steps) and the share caught within 60
  (resp. 300) steps: the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perseus.runtime.guard.sequential import SequentialSettings
from perseus.runtime.guard.simulation import (
    HostEvent,
    Noise,
    lognormal_noise,
    simulate,
    trace_noise,
)

TRACE = ROOT / "tests" / "data" / "straggler_noise.json"


def trace_ratios() -> list[float]:
    steps = json.loads(TRACE.read_text())["step_ms"].values()
    return [x / median(v) for v in steps for x in v]


def noises() -> dict[str, Callable[[], Noise]]:
    ratios = trace_ratios()
    return {"gpu 1%": lambda: lognormal_noise(0.01), "3%": lambda: lognormal_noise(0.03),
            "cpu trace": lambda: trace_noise(ratios)}


def detection(slowdown: float, make_noise: Callable[[], Noise], events: list[HostEvent], runs: int, within: int) -> str:
    steps = [simulate(2000, slowdown=slowdown, noise=make_noise(), events=events, seed=s).first_alarm
             for s in range(runs)]
    caught = sorted(s for s in steps if s is not None)
    share = sum(s < within for s in caught) / runs
    if len(caught) < 0.9 * runs:
        return f"{'-':>5} {'-':>5} {100 * share:5.0f}%"
    p90 = caught[min(len(caught) - 1, int(0.9 * runs))]
    return f"{median(caught):5.0f} {p90:5d} {100 * share:5.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per cell (detection)")
    parser.add_argument("--honest-steps", type=int, default=200_000, help="honest steps per row (false alarms)")
    args = parser.parse_args()
    s = SequentialSettings()
    print(f"settings: tolerance {s.tolerance:.0%}, reference {s.reference}, threshold {s.threshold} "
          f"(normal-theory windows to a false alarm {s.null_windows:.0f}), windows {s.backoff.first}..{s.backoff.longest} "
          f"steps ×{s.backoff.growth}, confident below +{s.detectable:.0%}")
    print(f"{'noise':10} {'period':>6} {'false alarms/10k':>17} {'probes all':>10} {'2nd half':>8}   "
          f"{'10% slower: med p90 <60':>24}   {'3% slower: med p90 <300':>24}")
    per_run = 20_000
    for name, make_noise in noises().items():
        for period in (None, 2, 4, 10, 25, 50, 100):
            events = [HostEvent(period, 0.3)] if period else []
            honest = [simulate(per_run, slowdown=0.0, noise=make_noise(), events=events, seed=1000 + r,
                               stop_at_alarm=False) for r in range(max(1, args.honest_steps // per_run))]
            steps = sum(r.steps for r in honest)
            alarms = sum(len(r.alarm_steps) for r in honest)
            share = sum(r.default_steps for r in honest) / steps
            tail = sum(r.tail_default_steps for r in honest) / sum(r.steps - r.steps // 2 for r in honest)
            print(f"{name:10} {period or '-':>6} {1e4 * alarms / steps:17.2f} {100 * share:9.2f}% {100 * tail:7.2f}%   "
                  f"{detection(0.10, make_noise, events, args.runs, 60):>24}   "
                  f"{detection(0.03, make_noise, events, args.runs, 300):>24}", flush=True)


if __name__ == "__main__":
    main()
