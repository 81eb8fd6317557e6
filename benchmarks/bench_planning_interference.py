"""Does planning slow rank 0's training steps? Planner in a thread vs in a niced child process.

Rank 0 plans while it trains. A GPU-bound trainer's Python thread spends most of a step blocked
(waiting on the GPU, a collective) and wakes up for short bursts of Python work (hooks, kernel
launches); every wake-up needs the GIL. A planner thread in the same process holds the GIL for
its Python-level work, so each wake-up may wait up to a switch interval (5 ms); a planner process
competes only for a CPU core, at lower priority (``os.nice``).

Each "training step" here is ``--instructions`` × (``--burst-us`` of Python work, then
``--wait-ms`` asleep, like a blocking GPU sync). Four modes: no planning; planning in a thread (the
runtime before: ``plan_frontier`` in a daemon thread); the runtime's planner process at nice 10
(``perseus.runtime.planner_process``, what it does now); the same process at nice 0, to separate
the GIL from the priority. They are interleaved in ``--rounds`` rounds so the shared machine's
load affects them alike, and each round's median is also divided by that round's no-planning
median (the paired ratio, whose spread shows the noise). While a mode runs, its planner plans the
``--stages`` × ``--microbatches`` 1F1B pipeline on the public GPT-3 A100 profile
(/work/shared/data, or ``PERSEUS_ARTIFACT_DATA``) over and over, so every measured step overlaps
planning. Prints median and p90 step time and their ratios to no planning, measured in the same run.

    python benchmarks/bench_planning_interference.py
    python benchmarks/bench_planning_interference.py --rounds 8 --steps 60   # docs/runtime.md's run
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-sosp24"))


def _plan_inputs(stages: int, microbatches: int):
    from perseus.profile import load_profile
    from perseus.schedule import build_schedule

    return build_schedule("1f1b", stages, microbatches), load_profile(DATA / "gpt3-175b+a100_sxm_bf16.csv", 83.64)


def plan_forever(schedule, profile, options):
    """Planner function for the runtime's planner process: plans until the process is stopped."""
    from perseus.planner import plan_frontier

    while True:
        plan_frontier(schedule, profile, options)


def _plan_in_thread(schedule, profile, stop: threading.Event) -> None:
    from perseus.planner import plan_frontier

    while not stop.is_set():
        plan_frontier(schedule, profile)


def _step(instructions: int, burst_s: float, wait_s: float) -> float:
    t0 = time.perf_counter()
    for _ in range(instructions):
        end = time.perf_counter() + burst_s
        x = 0
        while time.perf_counter() < end:  # Python work of the hooks and launches
            x += 1
        time.sleep(wait_s)  # blocked on the GPU: the GIL is free
    return time.perf_counter() - t0


def run_mode(mode: str, args: argparse.Namespace) -> list[float]:
    from perseus.planner import PlannerOptions
    from perseus.runtime.planner_process import ProcessPlanner

    schedule, profile = _plan_inputs(args.stages, args.microbatches)
    stop = threading.Event()
    thread = planner = None
    if mode == "thread":
        thread = threading.Thread(target=_plan_in_thread, args=(schedule, profile, stop), daemon=True)
        thread.start()
    elif mode.startswith("process"):
        import bench_planning_interference as me  # by module name: the child imports it (not __main__)

        planner = ProcessPlanner(schedule, profile, PlannerOptions(), me.plan_forever, nice=10 if mode == "process" else 0)
        time.sleep(args.child_start_s)  # let the child import and start planning before measuring
    times = [_step(args.instructions, args.burst_us * 1e-6, args.wait_ms * 1e-3) for _ in range(args.steps)]
    if thread is not None:
        stop.set()
        thread.join()  # finishes its current plan first
    if planner is not None:
        alive = planner.status == 0
        planner.close()
        if not alive:
            raise SystemExit(f"the planner process stopped early: {planner.error}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--instructions", type=int, default=32, help="wake-ups per training step")
    ap.add_argument("--burst-us", type=float, default=50.0)
    ap.add_argument("--wait-ms", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=120, help="steps per mode per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child-start-s", type=float, default=3.0, help="wait for the planner process to start")
    args = ap.parse_args()
    modes = ("none", "thread", "process", "process0")
    steps: dict[str, list[float]] = {m: [] for m in modes}
    paired: dict[str, list[float]] = {m: [] for m in modes}  # per round: median / that round's no-planning median
    for r in range(args.rounds):
        this = {mode: run_mode(mode, args) for mode in modes}
        for mode in modes:
            steps[mode] += this[mode]
            paired[mode].append(float(np.median(this[mode]) / np.median(this["none"])))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} x{paired[m][-1]:.2f}" for m in modes), file=sys.stderr)
    ref = np.array(steps["none"])
    ref_med, ref_p90 = np.median(ref), np.percentile(ref, 90)
    print(f"training step: {args.instructions} x ({args.burst_us:.0f} us Python + {args.wait_ms:.1f} ms blocked); "
          f"planning 1f1b {args.stages}x{args.microbatches} (GPT-3 A100 profile) in a loop; "
          f"{args.rounds} rounds x {args.steps} steps per mode; {os.cpu_count()} CPUs")
    print(f"{'planning':<24} {'median ms':>10} {'p90 ms':>10} {'median/none':>12} {'p90/none':>10} "
          f"{'per-round median ratios (min..max)':>36}")
    labels = {"none": "none", "thread": "thread (before)", "process": "process, nice 10 (now)",
              "process0": "process, nice 0"}
    for mode in modes:
        t = np.array(steps[mode])
        med, p90 = np.median(t), np.percentile(t, 90)
        rounds = paired[mode]
        spread = f"{np.median(rounds):.2f} ({min(rounds):.2f}..{max(rounds):.2f})"
        print(f"{labels[mode]:<24} {med * 1e3:>10.2f} {p90 * 1e3:>10.2f} {med / ref_med:>12.3f} {p90 / ref_p90:>10.3f} "
              f"{spread:>36}")


if __name__ == "__main__":
    main()
