"""What Perseus saves on overlapped (fused forward+backward) schedules, against their counterparts.

Pairs, each on the same model and GPUs:

- megatron-core: 1F1B and interleaved 1F1B (2 chunks) against the combined 1F1B
  (``megatron-combined-1f1b``, ``overlap_moe_expert_parallel_comm``, 2 chunks);
- torch.distributed.pipelining: ZBVZeroBubble against DualPipeV (both V, 2 chunks).

For each: the all-max iteration time and energy, Perseus' no-slowdown plan, its saving against
its own all-max clocks, and the fused schedule's no-slowdown energy against its counterpart's
(all-max, and with Perseus too), in the same run.

Assumptions (the shipped profiles measure only F and B):

- chunks split a stage evenly (``perseus.profile.split_into_chunks``); I = W = B/2 (DualPipeV's and
  ZBV's split backwards, ``split_backward``);
- a fused unit costs its forward plus its backward at every clock (``fuse_forward_backward``): what
  torch 2.13 executes for DualPipeV (its OVERLAP_F_B runs the two one after the other). On GPUs,
  megatron's combined 1F1B hides the expert all-to-all of one part behind the other's compute, so
  its units are shorter: ``--hidden H`` takes H of each fused unit's time and energy off (an
  assumption, not a measurement; online profiling measures the units).

    python benchmarks/bench_fused.py                                   # shipped example, 8 and 16 microbatches
    python benchmarks/bench_fused.py --hidden 0 0.15
    python benchmarks/bench_fused.py --profile gpt3.csv --p-blocking 83.64 --microbatches 16
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from perseus.errors import PerseusError
from perseus.examples import load_example_profile
from perseus.planner import plan_frontier
from perseus.profile import InstructionProfile, Profile, fuse_forward_backward, load_profile, split_backward, split_into_chunks
from perseus.schedules import FUSED, build_schedule

# (counterpart label, its name, its chunks) -> fused schedules compared with it
PAIRS = [
    (("1F1B (megatron)", "1f1b", 1), ("combined 1F1B (megatron, 2 chunks)", "megatron-combined-1f1b", 2)),
    (("interleaved (megatron, 2 chunks)", "interleaved", 2), ("combined 1F1B (megatron, 2 chunks)", "megatron-combined-1f1b", 2)),
    (("ZBVZeroBubble (torch, V)", "zbv", 2), ("DualPipeV (torch, V)", "dualpipev", 2)),
]


def shortened(profile: Profile, hidden: float) -> Profile:
    """Every fused unit ``hidden`` shorter and cheaper (the overlap's assumed gain)."""
    if hidden == 0:
        return profile
    entries = {key: (InstructionProfile(p.freqs_mhz, tuple(t * (1 - hidden) for t in p.times_s),
                                        tuple(e * (1 - hidden) for e in p.energies_j)) if key[2] == FUSED else p)
               for key, p in profile.entries.items()}
    return replace(profile, entries=entries)


def run(base: Profile, name: str, chunks: int, microbatches: int, hidden: float) -> dict:
    profile = split_backward(split_into_chunks(base, chunks) if chunks > 1 else base, 0.5)
    schedule = build_schedule(name, base.num_stages, microbatches, chunks)
    profile = shortened(fuse_forward_backward(profile, schedule), hidden)
    started = time.perf_counter()
    frontier = plan_frontier(schedule, profile)
    point = frontier.default_point()
    assert point.time_s <= frontier.baseline_time_s * (1 + 1e-9)
    return {"time_s": frontier.baseline_time_s, "energy_j": frontier.baseline_energy_j, "plan_j": point.energy_j,
            "saving": 1 - point.energy_j / frontier.baseline_energy_j, "solve_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, help="profile (default: the shipped example)")
    parser.add_argument("--p-blocking", type=float, help="P_blocking W (with a CSV profile)")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--hidden", type=float, nargs="+", default=[0.0],
                        help="share of each fused unit's time and energy its overlap hides (assumed; 0: F + B)")
    args = parser.parse_args(argv)
    base = load_example_profile() if args.profile is None else load_profile(args.profile, args.p_blocking)
    print(f"profile: {base.source}, {base.num_stages} stages; chunks split a stage evenly; I = W = B/2; "
          "fused unit = (F + B) x (1 - hidden)")
    for m in args.microbatches:
        for hidden in args.hidden:
            print(f"\n{base.num_stages} stages x {m} microbatches, hidden {100 * hidden:g} %")
            print(f"{'schedule':<38}{'all-max time':>13}{'all-max J':>11}{'no-slowdown J':>15}{'saving':>8}"
                  f"{'vs ref all-max':>16}{'vs ref+Perseus':>16}")
            for (ref_label, ref_name, ref_chunks), (label, name, chunks) in PAIRS:
                try:
                    ref = run(base, ref_name, ref_chunks, m, 0.0)
                    fused = run(base, name, chunks, m, hidden)
                except (PerseusError, ValueError) as exc:
                    print(f"{label:<38}  n/a: {exc}")
                    continue
                for text, r, against in ((ref_label, ref, None), (label, fused, ref)):
                    vs = "" if against is None else (f"{100 * (r['plan_j'] / against['energy_j'] - 1):>+15.1f}%"
                                                      f"{100 * (r['plan_j'] / against['plan_j'] - 1):>+15.1f}%")
                    print(f"{'  ' + text if against else text:<38}{r['time_s']:>12.4f}s{r['energy_j']:>11.1f}"
                          f"{r['plan_j']:>15.1f}{100 * r['saving']:>7.1f}%{vs}")


if __name__ == "__main__":
    main()
