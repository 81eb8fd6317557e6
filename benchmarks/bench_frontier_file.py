"""Frontier file size and load time: version 1 (legacy) vs version 2, side by side.

Builds synthetic frontiers of a large pipeline without running the planner (1F1B, 16 stages ×
512 microbatches = 16,384 instructions; 300 points plus 300 paced points by default) with two
clock patterns:

- ``walk``: like a planner's frontier, every point is the previous one with a few hundred
  instructions one clock step slower (neighbouring plans share most clocks);
- ``random``: every clock drawn independently (the worst case for compression).

Writes each as version 2 and version 1 and prints file size and load time (best of ``--repeat``
loads with ``perseus.frontier.load_frontier``). A full version 1 file of this size is ~1.3 GB and
takes minutes and many GB of memory to write and read, so by default version 1 is measured on
``--v1-points`` points and scaled linearly to the full count (its size and load time are linear
in the number of points); ``--full-v1`` measures the whole file instead.

    python benchmarks/bench_frontier_file.py
    python benchmarks/bench_frontier_file.py --stages 8 --microbatches 64 --points 100 --full-v1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.frontier import Frontier, FrontierPoint, load_frontier
from perseus.frontier.v1 import encode_v1
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier

CLOCKS_MHZ = np.arange(210, 1411, 15)  # A100 SM clocks: 81 values


def synthetic_points(num_instructions: int, points: int, paced: int, pattern: str, clocks_mhz: np.ndarray,
                     seed: int = 0) -> tuple[list[FrontierPoint], list[FrontierPoint]]:
    """Own-pace and paced points whose clocks follow ``pattern``: "walk" (each point slows 2 % of
    the instructions by one clock, as a planner's neighbouring points do) or "random" (worst case)."""
    rng = np.random.default_rng(seed)
    n = num_instructions
    total = points + paced
    if pattern == "random":
        levels = rng.integers(0, len(clocks_mhz), size=(total, n))
    else:
        levels = np.empty((total, n), dtype=np.int64)
        current = np.full(n, len(clocks_mhz) - 1)
        for i in range(total):
            slower = rng.choice(n, size=max(n // 50, 1), replace=False)
            current[slower] = np.maximum(current[slower] - 1, 0)
            levels[i] = current
    freqs = clocks_mhz[levels]
    times = 10.0 + np.cumsum(rng.uniform(0.001, 0.01, total))
    own = [FrontierPoint(float(times[i]), 5000.0 - i * 3.7 + rng.random(), freqs[i]) for i in range(points)]
    slow = [FrontierPoint(float(times[i]), 5000.0 - points * 3.7 + (i - points) * 0.9 + rng.random(), freqs[i])
            for i in range(points, total)]
    return own, slow


def synthetic_frontier(stages: int, microbatches: int, points: int, paced: int, pattern: str, seed: int = 0) -> Frontier:
    """A 1F1B frontier of the given size whose clocks follow ``pattern`` (walk or random)."""
    schedule = build_schedule("1f1b", stages, microbatches)
    own, slow = synthetic_points(schedule.num_instructions, points, paced, pattern, CLOCKS_MHZ, seed)
    return Frontier(schedule, 83.64, 10.0, 5100.0, own, gpu_name="A100 (synthetic)", solve_time_s=123.4,
                    metadata={"created_by": "bench_frontier_file", "profile": "synthetic"}, paced_points=slow)


def subset(frontier: Frontier, points: int, paced: int) -> Frontier:
    return Frontier(frontier.schedule, frontier.p_blocking_w, frontier.baseline_time_s, frontier.baseline_energy_j,
                    frontier.points[:points], frontier.gpu_name, frontier.solve_time_s, dict(frontier.metadata),
                    frontier.paced_points[:paced])


def best_load_s(path: Path, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        load_frontier(path)
        best = min(best, time.perf_counter() - started)
    return best


def measure(frontier: Frontier, directory: Path, version: int, repeat: int) -> tuple[int, float, float]:
    """(file bytes, write seconds, best load seconds) of one version."""
    path = directory / f"v{version}.json"
    started = time.perf_counter()
    if version == 2:
        save_frontier(frontier, path)
    else:
        path.write_text(json.dumps(encode_v1(frontier), separators=(",", ":")))
    written = time.perf_counter() - started
    size = path.stat().st_size
    load = best_load_s(path, repeat)
    path.unlink()
    return size, written, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=512)
    ap.add_argument("--points", type=int, default=300)
    ap.add_argument("--paced", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="loads per file; the best is reported")
    ap.add_argument("--v1-points", type=int, default=8, help="points (and paced points) of the measured v1 subset")
    ap.add_argument("--full-v1", action="store_true", help="write and load the whole v1 file (slow, GBs of memory)")
    args = ap.parse_args()

    total = args.points + args.paced
    print(f"1f1b {args.stages} stages x {args.microbatches} microbatches = {2 * args.stages * args.microbatches} "
          f"instructions; {args.points} points + {args.paced} paced points")
    print(f"{'pattern':8} {'version':22} {'size (MB)':>10} {'write (s)':>10} {'load (s)':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for pattern in ("walk", "random"):
            frontier = synthetic_frontier(args.stages, args.microbatches, args.points, args.paced, pattern)
            size, written, load = measure(frontier, directory, 2, args.repeat)
            print(f"{pattern:8} {'2':22} {size / 1e6:10.2f} {written:10.2f} {load:9.3f}")
            if args.full_v1:
                size, written, load = measure(frontier, directory, 1, 1)
                label = "1"
            else:
                k = min(args.v1_points, args.points)
                part = subset(frontier, k, min(k, args.paced))
                part_total = len(part.points) + len(part.paced_points)
                size, written, load = measure(part, directory, 1, args.repeat)
                scale = total / part_total
                size, written, load = int(size * scale), written * scale, load * scale
                label = f"1 (x{scale:.0f} of {part_total} pts)"
            print(f"{pattern:8} {label:22} {size / 1e6:10.2f} {written:10.2f} {load:9.3f}")


if __name__ == "__main__":
    main()
