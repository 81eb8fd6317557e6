#!/usr/bin/env python
"""The demo's A/B/A, repeated: deployed plan against default clocks re-measured after it.

    python benchmarks/bench_demo.py [--framework megatron|deepspeed] [--stages 4] [--runs 3] [--hogs 0]

Each run trains a real framework pipeline on CPU under torchrun with simulated GPUs (profiling,
planning, the deployed no-slowdown plan, then default clocks again) and measures, per run, the
deployed plan's median iteration time and energy against the re-measured baseline. Printed: every
run, then the median and spread (min..max) over runs; next to it the same plan accounted on the
simulated GPU's own model (what the tests check, independent of machine load). ``--hogs N``
starts N busy processes beside it, to see what a shared machine does to the wall-clock numbers.

These are the numbers the README quotes; tests never assert wall-clock time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from demo_checks import account, cached_frontier, steps_in  # noqa: E402
from loaded_suite import _spin  # noqa: E402

from perseus_demo.common import phase_table  # noqa: E402


def one_run(framework: str, stages: int, microbatches: int, out: Path) -> dict[str, float]:
    if framework == "megatron":
        from perseus_demo.megatron_demo import DemoConfig, launch
    else:
        from perseus_demo.deepspeed_demo import DemoConfig, launch
    cfg = DemoConfig(stages=stages, microbatches=microbatches)
    cfg.perseus = {**cfg.perseus, "cache_dir": str(out / "cache")}
    results = launch(cfg, out / "run")
    table = phase_table(results)
    plan, base = table["deployed"], table["baseline again"]
    acc = account(results, cfg, out / "cache", cached_frontier(out / "cache").default_point(),
                  steps_in(results[0], "deployed"))
    return {"time": plan["time_s"] / base["time_s"] - 1.0, "saving": 1.0 - plan["energy_j"] / base["energy_j"],
            "true_time": acc.slowdown, "true_saving": acc.saving, "applied": acc.applied_share}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["megatron", "deepspeed"], default="megatron")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=0, help="busy processes beside the runs")
    args = parser.parse_args(argv)
    hogs = [mp.get_context("spawn").Process(target=_spin, args=(3600.0, mp.current_process().pid), daemon=True)
            for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    rows = []
    try:
        for i in range(args.runs):
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="perseus-bench-demo-") as tmp:
                row = one_run(args.framework, args.stages, args.microbatches, Path(tmp))
            rows.append(row)
            print(f"run {i + 1}: wall clock: saving {100 * row['saving']:5.1f} %, time {100 * row['time']:+5.1f} %   "
                  f"true model: saving {100 * row['true_saving']:5.1f} %, time {100 * row['true_time']:+5.2f} %   "
                  f"clocks applied {100 * row['applied']:5.1f} %   ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        for h in hogs:
            h.kill()

    def stat(key: str, digits: int = 1) -> str:
        values = [100 * r[key] for r in rows]
        return f"{statistics.median(values):+.{digits}f} % ({min(values):+.{digits}f}..{max(values):+.{digits}f})"

    print(f"\n{args.framework}, {args.stages} stages x {args.microbatches} microbatches, {args.runs} runs, "
          f"{args.hogs} busy processes beside; median (min..max)")
    print(f"{'':<24}{'energy saving':>28}{'iteration time':>30}")
    print(f"{'wall clock (A/B/A)':<24}{stat('saving'):>28}{stat('time'):>30}")
    print(f"{'true model (simulator)':<24}{stat('true_saving'):>28}{stat('true_time', 2):>30}")
    print(f"clocks applied as planned: {stat('applied')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
