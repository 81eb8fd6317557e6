#!/usr/bin/env python
"""The no-slowdown guard's error rates and probe cost, by simulation (no GPU, no timing of this machine).

    python benchmarks/bench_guard.py                # the tables docs/runtime.md quotes
    python benchmarks/bench_guard.py --runs 10      # quicker, coarser
    python benchmarks/bench_guard.py --energy-only --json   # the energy guard's rows alone, and the JSON

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

The energy guard's rows (``simulate_energy``: a 2-stage pipeline, plan steps as fast as the probes,
each stage's step energy with the row's shared noise and its own log-normal noise): deployed steps
until a plan that saves nothing (``+2 %`` more energy, ``0 %``) is dropped (median, largest, share
within 100), and drops among honest plans (10, 15 and 20 % saving, and 20 % on one stage with 3 %
more on the other) over ``--energy-seeds`` seeds of 3,000 steps each. The JSON's
``energy_guard_steps`` (the largest, ``null`` if a run was never dropped within 2,000 steps) and
``energy_guard_false_drops`` are the "3%" row's (per-stage energy CV about 3.6 %).
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

from perseus.runtime.guard.sequential import EnergySettings, SequentialSettings
from perseus.runtime.guard.simulation import (
    HostEvent,
    Noise,
    lognormal_noise,
    simulate,
    simulate_energy,
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


# per energy row: the step's shared noise and each stage's own energy noise (log-normal spread)
ENERGY_NOISE: dict[str, tuple[Callable[[list[float]], Noise], float]] = {
    "gpu 1%": (lambda _: lognormal_noise(0.01), 0.01), "3%": (lambda _: lognormal_noise(0.02), 0.03),
    "5%": (lambda _: lognormal_noise(0.03), 0.05), "cpu trace": (trace_noise, 0.03)}
LYING = {"+2%": [-0.02, -0.02], "0%": [0.0, 0.0]}
HONEST = [[0.10, 0.10], [0.15, 0.15], [0.20, 0.20], [0.20, -0.03]]


def energy_row(name: str, seeds: int) -> dict[str, object]:
    """One noise's energy guard: steps to drop the plans that save nothing, drops of honest ones."""
    make, cv = ENERGY_NOISE[name]
    ratios = trace_ratios()
    row: dict[str, object] = {"noise": name}
    for label, savings in LYING.items():
        runs = [simulate_energy(2000, savings=savings, noise=make(ratios), stage_cv=cv, seed=s) for s in range(seeds)]
        dropped = sorted(r.dropped_at + 1 for r in runs if r.dropped_at is not None)
        row[label] = {"median": median(dropped) if dropped else None,
                      "largest": dropped[-1] if len(dropped) == seeds else None,
                      "within_100": sum(d <= 100 for d in dropped) / seeds}
    honest = [simulate_energy(3000, savings=savings, noise=make(ratios), stage_cv=cv, seed=10_000 + s)
              for savings in HONEST for s in range(seeds)]
    row["false_drops"] = sum(r.dropped_at is not None for r in honest)
    row["honest_runs"] = len(honest)
    return row


def energy_table(seeds: int) -> list[dict[str, object]]:
    e = EnergySettings()
    print(f"energy guard: margin {e.margin:.0%}, reference {e.reference}, threshold {e.threshold}, score within "
          f"±{e.clip}; 2 stages, plan as fast as its probes; {seeds} seeds per cell")
    print(f"{'noise':10} {'+2% more: med max <=100':>25} {'0%: med max <=100':>25} {'honest drops':>14}")
    rows = []
    for name in ENERGY_NOISE:
        row = energy_row(name, seeds)
        cells = []
        for label in LYING:
            c = row[label]
            assert isinstance(c, dict)
            cells.append(f"{c['median'] or '-':>7} {c['largest'] or '-':>6} {100 * c['within_100']:5.0f}%")
        print(f"{name:10} {cells[0]:>25} {cells[1]:>25} {row['false_drops']:>6}/{row['honest_runs']}", flush=True)
        rows.append(row)
    return rows


def detection(slowdown: float, make_noise: Callable[[], Noise], events: list[HostEvent], runs: int, within: int) -> str:
    steps = [simulate(2000, slowdown=slowdown, noise=make_noise(), events=events, seed=s).first_alarm
             for s in range(runs)]
    caught = sorted(s for s in steps if s is not None)
    share = sum(s < within for s in caught) / runs
    if len(caught) < 0.9 * runs:
        return f"{'-':>5} {'-':>5} {100 * share:5.0f}%"
    p90 = caught[min(len(caught) - 1, int(0.9 * runs))]
    return f"{median(caught):5.0f} {p90:5d} {100 * share:5.0f}%"


def time_table(runs: int, honest_steps: int) -> list[dict[str, object]]:
    """The no-slowdown guard's rows (module docstring), printed and returned."""
    rows: list[dict[str, object]] = []
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
                               stop_at_alarm=False) for r in range(max(1, honest_steps // per_run))]
            steps = sum(r.steps for r in honest)
            alarms = sum(len(r.alarm_steps) for r in honest)
            share = sum(r.default_steps for r in honest) / steps
            tail = sum(r.tail_default_steps for r in honest) / sum(r.steps - r.steps // 2 for r in honest)
            ten, three = detection(0.10, make_noise, events, runs, 60), detection(0.03, make_noise, events, runs, 300)
            print(f"{name:10} {period or '-':>6} {1e4 * alarms / steps:17.2f} {100 * share:9.2f}% {100 * tail:7.2f}%   "
                  f"{ten:>24}   {three:>24}", flush=True)
            rows.append({"noise": name, "period": period, "false_alarms_per_10k": 1e4 * alarms / steps,
                         "probe_share": share, "probe_share_2nd_half": tail, "slower_10": ten.split(), "slower_3": three.split()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per cell (detection)")
    parser.add_argument("--honest-steps", type=int, default=200_000, help="honest steps per row (false alarms)")
    parser.add_argument("--energy-seeds", type=int, default=40, help="seeds per energy cell")
    parser.add_argument("--energy-only", action="store_true", help="the energy guard's rows alone")
    parser.add_argument("--json", action="store_true", help="print the results as JSON at the end")
    args = parser.parse_args()
    time_rows = [] if args.energy_only else time_table(args.runs, args.honest_steps)
    energy = energy_table(args.energy_seeds)
    at = next(r for r in energy if r["noise"] == "3%")
    lying = at["+2%"]
    assert isinstance(lying, dict)
    keys = {"energy_guard_steps": lying["largest"], "energy_guard_false_drops": at["false_drops"]}
    print(f"energy_guard_steps {keys['energy_guard_steps']} (acceptance <= 100), "
          f"energy_guard_false_drops {keys['energy_guard_false_drops']} of {at['honest_runs']} honest runs (acceptance 0)")
    if args.json:
        print(json.dumps({**keys, "energy": energy, "time": time_rows}, indent=2))


if __name__ == "__main__":
    main()
