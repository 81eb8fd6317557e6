"""Intrinsic energy bloat of 1F1B vs interleaved vs zero-bubble schedules on one profile.

Intrinsic bloat is what Perseus removes at no slowdown: the energy its no-slowdown plan saves
against all instructions at the max clock, with the iteration time unchanged. It comes from
the pipeline's imbalance and bubbles (instructions off the critical path can run slower), so a
schedule with fewer bubbles leaves less of it.

Assumptions, so that every schedule runs the same model on the same GPUs:

- profile: the shipped example (``perseus/examples``: 4 stages, A100-like, synthetic; its last
  stage is heavier, as the loss layer makes real ones) or ``--profile P --p-blocking W``;
- chunks: a stage's layers split evenly over its C chunks, so every chunk instruction takes 1/C
  of the stage's time and energy at every clock (``perseus.profile.split_into_chunks``);
- zero bubble: I and W each take half of the full backward's time and energy at every clock
  (``--input-share``; ``perseus.profile.split_backward``). Measured I/W (perseus_torch profiles
  them online) make this exact.

    python benchmarks/bench_zero_bubble.py                  # example profile, 8 and 16 microbatches
    python benchmarks/bench_zero_bubble.py --microbatches 8 --input-share 0.6
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.errors import PerseusError
from perseus.examples import load_example_profile
from perseus.planner import plan_frontier
from perseus.profile import Profile, load_profile, split_backward, split_into_chunks
from perseus.schedules import build_schedule
from perseus.timeline.simulator import max_frequency_plan, plan_costs

# (label, build_schedule name, chunks)
SCHEDULES = [
    ("1F1B", "1f1b", 1),
    ("Interleaved1F1B (torch, 2 chunks)", "torch-interleaved", 2),
    ("interleaved (megatron, 2 chunks)", "interleaved", 2),
    ("ZB1P (zb-interleaved, 1 chunk)", "zb-interleaved", 1),
    ("InterleavedZeroBubble (2 chunks)", "zb-interleaved", 2),
    ("ZBVZeroBubble (V, 2 chunks)", "zbv", 2),
]


def run(base: Profile, label: str, name: str, chunks: int, microbatches: int, input_share: float) -> dict:
    profile = split_into_chunks(base, chunks) if chunks > 1 else base
    profile = split_backward(profile, input_share)
    schedule = build_schedule(name, base.num_stages, microbatches, chunks)
    started = time.perf_counter()
    frontier = plan_frontier(schedule, profile)
    solve_s = time.perf_counter() - started
    dag = InstructionDAG.from_schedule(schedule)
    busy, _ = plan_costs(dag, profile, max_frequency_plan(dag, profile))
    bubble = 1.0 - float(np.sum(busy)) / (schedule.num_stages * frontier.baseline_time_s)
    point = frontier.default_point()
    return {"label": label, "time_s": frontier.baseline_time_s, "energy_j": frontier.baseline_energy_j,
            "bubble": bubble, "plan_energy_j": point.energy_j, "plan_time_s": point.time_s,
            "saving": 1.0 - point.energy_j / frontier.baseline_energy_j, "solve_s": solve_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, help="profile (default: the shipped example)")
    parser.add_argument("--p-blocking", type=float, help="P_blocking W (with a CSV profile)")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--input-share", type=float, default=0.5, help="I's share of a backward (W gets the rest)")
    args = parser.parse_args(argv)
    base = load_example_profile() if args.profile is None else load_profile(args.profile, args.p_blocking)
    print(f"profile: {base.source}, {base.num_stages} stages; I/W = {args.input_share:g}/{1 - args.input_share:g} of B; "
          "chunks split a stage evenly")
    for m in args.microbatches:
        print(f"\n{base.num_stages} stages x {m} microbatches")
        print(f"{'schedule':<36}{'all-max time':>13}{'bubble':>8}{'all-max J':>11}{'no-slowdown J':>15}"
              f"{'saving':>8}{'solve':>7}")
        for label, name, chunks in SCHEDULES:
            try:
                r = run(base, label, name, chunks, m, args.input_share)
            except (PerseusError, ValueError) as exc:
                print(f"{label:<36}  n/a: {exc}")
                continue
            assert r["plan_time_s"] <= r["time_s"] * (1 + 1e-9)
            print(f"{r['label']:<36}{r['time_s']:>12.4f}s{100 * r['bubble']:>7.1f}%{r['energy_j']:>11.1f}"
                  f"{r['plan_energy_j']:>15.1f}{100 * r['saving']:>7.1f}%{r['solve_s']:>6.1f}s")


if __name__ == "__main__":
    main()
