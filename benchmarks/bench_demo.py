#!/usr/bin/env python
"""The demo's A/B/A, repeated: deployed plan against default clocks re-measured after it.

    python benchmarks/bench_demo.py [--framework megatron|deepspeed] [--stages 4] [--runs 3] [--hogs 0]
    python benchmarks/bench_demo.py --latencies-ms 0,5,20 --switch-ahead both   # clock-switch latency

Each run trains a real framework pipeline on CPU under torchrun with simulated GPUs (profiling,
planning, the deployed no-slowdown plan, then default clocks again) and measures, per run, the
deployed plan's median iteration time and energy against the re-measured baseline. Printed: every
run, then the median and spread (min..max) over runs; next to it the same plan accounted on the
simulated GPU's own model (what the tests check, independent of machine load). ``--hogs N``
starts N busy processes beside it, to see what a shared machine does to the wall-clock numbers.
``--latencies-ms`` gives the simulated GPUs a clock-switch latency (each value a setting), and
``--switch-ahead on|off|both`` whether the runtime asks for each clock when the previous
instruction ends (latency hidden behind the wait) or when its own instruction starts.

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
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

from demo_ab import run_demo
from loaded_suite import _spin


def one_run(framework: str, stages: int, microbatches: int, out: Path, latency_s: float = 0.0,
            switch_ahead: bool = True, planner_knows: bool = False) -> dict[str, float]:
    return run_demo(out, framework=framework, stages=stages, microbatches=microbatches, latency_s=latency_s,
                    switch_ahead=switch_ahead, planner_knows=planner_knows).numbers


def _stat(rows: list[dict[str, float]], key: str, digits: int = 1) -> str:
    values = [100 * r[key] for r in rows]
    return f"{statistics.median(values):+.{digits}f} % ({min(values):+.{digits}f}..{max(values):+.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["megatron", "deepspeed"], default="megatron")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--latencies-ms", default="0", help="clock-switch latencies of the simulated GPUs, e.g. 0,5,20")
    parser.add_argument("--switch-ahead", choices=["on", "off", "both"], default="on")
    parser.add_argument("--planner-knows-latency", choices=["on", "off", "both"], default="off",
                        help="give the planner and the runtime the latency (planner_options.switch_latency_s): "
                             "latency hiding")
    args = parser.parse_args(argv)
    latencies = [float(x) / 1e3 for x in args.latencies_ms.split(",")]
    aheads = {"on": [True], "off": [False], "both": [False, True]}[args.switch_ahead]
    knows = {"on": [True], "off": [False], "both": [False, True]}[args.planner_knows_latency]
    hogs = [mp.get_context("spawn").Process(target=_spin, args=(3600.0, mp.current_process().pid), daemon=True)
            for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    table: list[tuple[str, list[dict[str, float]]]] = []
    try:
        settings = [(lat, ahead, know) for lat in latencies for ahead in aheads for know in knows
                    if not (know and lat == 0)]
        for latency, ahead, know in settings:
            name = (f"latency {latency * 1e3:g} ms, ahead {'on' if ahead else 'off'}"
                    + (", planner knows" if know else ""))
            rows = []
            for i in range(args.runs):
                started = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="perseus-bench-demo-") as tmp:
                    row = one_run(args.framework, args.stages, args.microbatches, Path(tmp), latency, ahead, know)
                rows.append(row)
                print(f"{name}, run {i + 1}: wall clock: saving {100 * row['saving']:5.1f} %, time "
                      f"{100 * row['time']:+5.1f} %   true model: saving {100 * row['true_saving']:5.1f} %, time "
                      f"{100 * row['true_time']:+5.2f} %   clocks applied {100 * row['applied']:5.1f} %   "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
            table.append((name, rows))
    finally:
        for h in hogs:
            h.kill()
    print(f"\n{args.framework}, {args.stages} stages x {args.microbatches} microbatches, {args.runs} runs each, "
          f"{args.hogs} busy processes beside; median (min..max); deployed plan vs default clocks re-measured after it")
    print("time: wall clock (everything) = plan on the true model (profile errors) + clocks as applied "
          "(late switches) + the rest (host: hooks, controller, load)")
    print(f"{'setting':<44}{'saving (wall)':>26}{'time (wall)':>26}{'time (plan, model)':>26}"
          f"{'time (applied, model)':>26}{'saving (model)':>26}{'clocks applied':>26}")
    for name, rows in table:
        print(f"{name:<44}{_stat(rows, 'saving'):>26}{_stat(rows, 'time'):>26}{_stat(rows, 'true_time', 2):>26}"
              f"{_stat(rows, 'applied_time', 2):>26}{_stat(rows, 'true_saving'):>26}{_stat(rows, 'applied'):>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
