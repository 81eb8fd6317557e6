"""Bytes on the wire after planning: the whole frontier broadcast vs each rank's own stage.

Before: rank 0 broadcast the whole frontier (its version 2 document, ``broadcast_object``) and
every rank held all of it. Now: rank 0 sends each rank only its stage's slice
(``perseus.planner.stage_plan``: every point's time and energy, that stage's clocks as a
compressed index matrix), point to point, and every rank holds only that.

Builds a synthetic frontier of the given size without running the planner (interleaved 1F1B,
16 stages × 4 chunks × 128 microbatches = 16,384 instructions, 300 points plus 200 paced points
by default; the planner finds ~300 + ~200 on the GPT-3 profiles) with two clock patterns:

- ``walk``: like a planner's frontier, every point is the previous one with 2 % of the
  instructions one clock step slower (neighbouring plans share most clocks);
- ``random``: every clock drawn independently (the worst case for compression).

Prints, per pattern: what each rank receives, what rank 0 sends in all (``--dp`` data-parallel
replicas of each stage; a broadcast's bytes are counted as rank 0 sending every other rank the
whole document, whatever tree gloo uses, since every rank receives all of it), the clock arrays a
rank holds afterwards, and rank 0's encoding time. Sizes are exact (the bytes the runtime sends);
times are this machine's, noisy.

Then the work on rank 0's training thread at the step the plan is ready, the median of
``--repeat`` runs: before, the planner process replied with the frontier's version 2 document and
rank 0 decoded it, encoded every stage's slice and wrote the cache file; now the planner process
does all that (``planner_process.hand_over``, timed too: it costs planning wall time, not
training time) and rank 0 unpickles the hand-over and decodes its own stage's slice.

    python benchmarks/bench_plan_wire.py
    python benchmarks/bench_plan_wire.py --stages 8 --microbatches 64 --chunks 2 --dp 4
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_frontier_file import synthetic_points

from perseus.store.cache import RunCache
from perseus.frontier import Frontier, encode_frontier_json, frontier_from_json_dict
from perseus.runtime.plane.collective import decode_frontier, encode_frontier
from perseus.planner.process import hand_over, planned_stages
from perseus.planner.stage_plan import decode_stage, encode_stage
from perseus.schedules import build_schedule

CLOCKS_MHZ = np.arange(210, 1981, 15)  # H100 SM clocks: 119 values


def synthetic_frontier(stages: int, microbatches: int, chunks: int, points: int, paced: int, pattern: str,
                       seed: int = 0) -> Frontier:
    schedule = build_schedule("interleaved", stages, microbatches, chunks)
    own, slow = synthetic_points(schedule.num_instructions, points, paced, pattern, CLOCKS_MHZ, seed)
    times = [p.time_s for p in own]
    return Frontier(schedule, 90.0, float(times[0]), 5000.0, own, gpu_name="H100 SXM", paced_points=slow)


def mb(n: float) -> str:
    return f"{n / 1e6:9.3f}"


def measure(front: Frontier, dp: int) -> dict:
    sched = front.schedule
    world = sched.num_stages * dp
    t0 = time.perf_counter()
    whole = pickle.dumps(encode_frontier(front))  # what broadcast_object pickled and sent
    t_whole = time.perf_counter() - t0
    t0 = time.perf_counter()
    slices = [encode_stage(front, s) for s in range(sched.num_stages)]  # once per stage, whatever dp
    t_stage = time.perf_counter() - t0
    held_whole = sum(p.freqs_mhz.nbytes for p in decode_frontier(pickle.loads(whole)).points
                     + decode_frontier(pickle.loads(whole)).paced_points)
    held_stage = max(decode_stage(b, sched, s).nbytes() for s, b in enumerate(slices))
    sizes = [len(b) for b in slices]
    return {
        "whole": len(whole), "t_whole": t_whole, "t_stage": t_stage,
        "stage_max": max(sizes), "stage_mean": sum(sizes) / len(sizes),
        "sent_whole": len(whole) * (world - 1), "sent_stage": dp * sum(sizes) - sizes[0],
        "held_whole": held_whole, "held_stage": held_stage, "world": world,
    }


def rank0_at_hand_over(front: Frontier, cache_dir: Path) -> dict:
    """Seconds of rank 0's training-thread work (and the planner process's) when the plan arrives."""
    sched = front.schedule
    reply = pickle.dumps(("ok", encode_frontier_json(front)), pickle.HIGHEST_PROTOCOL)  # the planner process's, before
    t0 = time.perf_counter()
    whole = frontier_from_json_dict(pickle.loads(reply)[1], "frontier from the planner process")
    slices = [encode_stage(whole, s) for s in range(sched.num_stages)]
    RunCache(cache_dir / "before", {"bench": "plan_wire"}).save_frontier(whole)
    decode_stage(slices[0], sched, 0)
    before = time.perf_counter() - t0
    t0 = time.perf_counter()
    reply = pickle.dumps(("ok", hand_over(front, RunCache(cache_dir / "now", {"bench": "plan_wire"}), encode_stage)),
                         pickle.HIGHEST_PROTOCOL)
    child = time.perf_counter() - t0
    t0 = time.perf_counter()
    planned = planned_stages(pickle.loads(reply)[1])
    decode_stage(planned.bytes_of(0), sched, 0)
    now = time.perf_counter() - t0
    return {"before": before, "now": now, "child": child, "reply": len(reply)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=128)
    ap.add_argument("--points", type=int, default=300)
    ap.add_argument("--paced", type=int, default=200)
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas of every stage")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the hand-over timing (median)")
    args = ap.parse_args()
    n = args.stages * args.chunks * args.microbatches * 2
    print(f"interleaved {args.stages} stages x {args.chunks} chunks x {args.microbatches} microbatches "
          f"({n:,} instructions), {args.points} points + {args.paced} paced points, {args.dp} replica(s) per stage")
    print(f"{'pattern':<8} {'transport':<22} {'rank receives MB':>17} {'rank 0 sends MB':>16} "
          f"{'rank holds MB':>14} {'rank 0 encode s':>16}")
    handover = {}
    for pattern in ("walk", "random"):
        front = synthetic_frontier(args.stages, args.microbatches, args.chunks, args.points, args.paced, pattern)
        with tempfile.TemporaryDirectory() as tmp:
            runs = [rank0_at_hand_over(front, Path(tmp)) for _ in range(args.repeat)]
        handover[pattern] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
        m = measure(front, args.dp)
        print(f"{pattern:<8} {'whole, broadcast':<22} {mb(m['whole']):>17} {mb(m['sent_whole']):>16} "
              f"{mb(m['held_whole']):>14} {m['t_whole']:>16.2f}")
        print(f"{pattern:<8} {'own stage, p2p':<22} {mb(m['stage_max']):>17} {mb(m['sent_stage']):>16} "
              f"{mb(m['held_stage']):>14} {m['t_stage']:>16.2f}")
        print(f"{pattern:<8} {'ratio (stage / whole)':<22} {m['stage_max'] / m['whole']:>17.4f} "
              f"{m['sent_stage'] / m['sent_whole']:>16.4f} {m['held_stage'] / m['held_whole']:>14.4f}")
    print("rank receives: the largest stage's slice (per stage: its size; whole: every rank). rank holds: the clock "
          "arrays after decoding (whole: int64 per instruction and point; stage: uint8 indices)")
    print(f"\nrank 0 at the step the plan is ready (median of {args.repeat}; the cache write included where it is done)")
    print(f"{'pattern':<8} {'training thread before s':>25} {'training thread now s':>22} {'now / before':>13} "
          f"{'planner process adds s':>23} {'hand-over MB':>13}")
    for pattern, h in handover.items():
        print(f"{pattern:<8} {h['before']:>25.3f} {h['now']:>22.4f} {h['now'] / h['before']:>13.4f} "
              f"{h['child']:>23.3f} {mb(h['reply']):>13}")


if __name__ == "__main__":
    main()
