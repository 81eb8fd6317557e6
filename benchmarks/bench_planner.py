"""Planner benchmark: perseus vs lowtime 0.3.0 on the public GPT-3 175B profiles, side by side.

For each instance: solve time of each, frontier sizes, energy of each at the all-max-frequency
iteration time (lowtime's best plan within that time, "-" when it has none), the worst energy
difference over lowtime's plans (ours at lookup(t) − lowtime's at t; ≤ 0 means never worse) and
peak Python memory (tracemalloc) of our planner. Every energy is the plan simulated on the
measured profile. Lowtime runs only up to ``--lowtime-max-mb`` microbatches (it takes minutes).

    python benchmarks/bench_planner.py                 # A100 8×{4,8,12} with lowtime, 8×{32,96} ours only
    python benchmarks/bench_planner.py --lowtime-max-mb 32
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from planner_lowtime import best_at, lowtime_available, run_lowtime

from perseus.planner import plan_frontier
from perseus.profile import load_profile
from perseus.schedules import build_schedule

DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data" / "perseus-sosp24"))
PROFILES = {"a100": ("gpt3-175b+a100_sxm_bf16.csv", 83.64), "a40": ("gpt3-175b+a40_bf16.csv", 70.38)}


def run(gpu: str, stages: int, microbatches: int, with_lowtime: bool) -> dict:
    name, p_b = PROFILES[gpu]
    profile = load_profile(DATA / name, p_b)
    schedule = build_schedule("1f1b", stages, microbatches)
    started = time.perf_counter()
    frontier = plan_frontier(schedule, profile)
    ours_s = time.perf_counter() - started
    # Memory in a second run: tracemalloc slows allocation-heavy code, so it is kept off the timing.
    tracemalloc.start()
    plan_frontier(schedule, profile)
    peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    row = dict(
        instance=f"{gpu} {stages}x{microbatches}",
        ours_s=ours_s,
        ours_pts=len(frontier.points),
        base_e=frontier.baseline_energy_j,
        ours_e=frontier.default_point().energy_j,
        peak_mb=peak_mb,
        fastest_ok=frontier.fastest.time_s <= frontier.baseline_time_s,
    )
    if with_lowtime:
        lt = run_lowtime(schedule, profile)
        at_base = best_at(lt.plans, frontier.baseline_time_s)
        worst = max(frontier.lookup(p.time_s).energy_j - p.energy_j for p in lt.plans)
        fastest = min(p.time_s for p in lt.plans)
        row.update(
            lt_s=lt.solve_time_s,
            lt_pts=len(lt.plans),
            lt_e=None if at_base is None else at_base.energy_j,
            worst=worst,
            lt_slow=100 * (fastest / frontier.baseline_time_s - 1),
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lowtime-max-mb", type=int, default=12, help="run lowtime up to this many microbatches")
    parser.add_argument("--gpu", choices=sorted(PROFILES), default="a100")
    parser.add_argument("--microbatches", type=int, nargs="*", default=[4, 8, 12, 32, 96])
    parser.add_argument("--stages", type=int, default=8)
    args = parser.parse_args()
    if not (DATA / PROFILES[args.gpu][0]).exists():
        sys.exit(f"profile data not found under {DATA}")
    has_lowtime = lowtime_available()
    header = (
        f"{'instance':<12} {'lowtime s':>9} {'ours s':>7} {'speedup':>8} {'#pts lt':>7} {'#pts ours':>9} "
        f"{'E all-max':>10} {'E lt@max':>10} {'E ours@max':>10} {'worst ours-lt':>13} {'lt fastest':>10} {'peak MiB':>8}"
    )
    print(header)
    print("-" * len(header))
    for mb in args.microbatches:
        r = run(args.gpu, args.stages, mb, has_lowtime and mb <= args.lowtime_max_mb)
        lt = "lt_s" in r
        lt_s = f"{r['lt_s']:.2f}" if lt else "-"
        speedup = f"{r['lt_s'] / r['ours_s']:.1f}x" if lt else "-"
        lt_pts = str(r["lt_pts"]) if lt else "-"
        lt_e = f"{r['lt_e']:.1f}" if lt and r["lt_e"] is not None else "-"
        worst = f"{r['worst']:+.2f} J" if lt else "-"
        lt_slow = f"+{r['lt_slow']:.2f}%" if lt else "-"
        print(
            f"{r['instance']:<12} {lt_s:>9} {r['ours_s']:>7.2f} {speedup:>8} {lt_pts:>7} {r['ours_pts']:>9} "
            f"{r['base_e']:>10.1f} {lt_e:>10} {r['ours_e']:>10.1f} {worst:>13} {lt_slow:>10} {r['peak_mb']:>8.1f}",
            flush=True,
        )
        assert r["fastest_ok"], "planner's fastest plan is slower than all-max"


if __name__ == "__main__":
    main()
