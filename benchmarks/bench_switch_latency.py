#!/usr/bin/env python
"""Clock-switch latency: the demo's A/B/A per latency, and where the deployed plan's time went.

    python benchmarks/bench_switch_latency.py [--latencies-ms 0,5,20] [--runs 3] [--stages 2 --microbatches 4]
    python benchmarks/bench_switch_latency.py --planner-knows-latency off   # plans as if switches were instant

Each run is ``perseus_demo.megatron_demo`` (real megatron-core on CPU, simulated GPUs with the
given switch latency) with ``trace_clocks`` on: profiling, planning, the deployed no-slowdown plan,
then default clocks re-measured (A/B/A). Printed per latency: median and spread (min..max) over
runs of the deployed-vs-baseline iteration time and energy, on the wall clock and on the
simulated GPU's own model; then the breakdown from the clock traces (``perseus.runtime.clock_trace``):
share of instructions whose planned clock was not in force when their kernel started and how
late it was, and per iteration of the slowest stage (deployed minus baseline): kernel time beyond
the planned clock's, the wait for the kernel returning after it ended (sleep overshoot), time in
the runtime's hooks, the controller process's CPU time and the trainer's.

Wall-clock numbers depend on the machine's load (four trainers and their controllers share two
cores here); tests never assert them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from demo_checks import account, cached_frontier, steps_in  # noqa: E402

from perseus.dag import InstructionDAG  # noqa: E402
from perseus.simulator import longest_path_finish  # noqa: E402

from perseus.runtime.clock_trace import Breakdown, breakdown, from_dict  # noqa: E402
from perseus_demo.common import phase_table  # noqa: E402

DEPLOYED, BASELINE = "deployed", "stopped"


def one_run(stages: int, microbatches: int, out: Path, latency_s: float, planner_knows: bool) -> dict[str, Any]:
    from perseus_demo.megatron_demo import DemoConfig, launch

    cfg = DemoConfig(stages=stages, microbatches=microbatches)
    cfg.sim_gpu = {**cfg.sim_gpu, "switch_latency_s": latency_s}
    cfg.perseus = {**cfg.perseus, "cache_dir": str(out / "cache"), "trace_clocks": True}
    if planner_knows and latency_s > 0:
        cfg.perseus["planner_options"] = {"switch_latency_s": latency_s}
    results = launch(cfg, out / "run")
    table = phase_table(results)
    plan, base = table["deployed"], table["baseline again"]
    frontier = cached_frontier(out / "cache")
    acc = account(results, cfg, out / "cache", frontier.default_point(), steps_in(results[0], "deployed"))
    paths = {phase: kernel_paths(results, frontier, cfg, phase) for phase in (DEPLOYED, BASELINE)}
    per_rank = []
    for r in results:
        insts, steps = from_dict(r["summary"]["clock_trace"])
        per_rank.append((r["stage"], breakdown(insts, steps, lambda p: p == DEPLOYED),
                         breakdown(insts, steps, lambda p: p == BASELINE)))
    return {"time": plan["time_s"] / base["time_s"] - 1.0, "saving": 1.0 - plan["energy_j"] / base["energy_j"],
            "true_time": acc.slowdown, "true_saving": acc.saving, "applied": acc.applied_share,
            "applied_time": acc.applied_slowdown, "ranks": per_rank, "base_time_s": base["time_s"],
            "wall_diff_s": plan["time_s"] - base["time_s"],
            "clock_path_diff_s": paths[DEPLOYED][0] - paths[BASELINE][0],
            "kernel_path_diff_s": paths[DEPLOYED][1] - paths[BASELINE][1]}


def kernel_paths(results: list[dict[str, Any]], frontier: Any, cfg: Any, phase: str) -> tuple[float, float]:
    """Median over the phase's steps of the iteration time the traced kernels alone give (longest
    path through the schedule's DAG, no host time): with each kernel's nominal work stretched as
    its clocks really were (clocks and late switches), and with its actual duration (plus CPU work
    beyond the nominal time)."""
    dag = InstructionDAG.from_schedule(frontier.schedule)
    by_stage: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for r in sorted(results, key=lambda r: r["dp_rank"], reverse=True):
        insts, steps = from_dict(r["summary"]["clock_trace"])
        chosen = {st.step for st in steps if st.phase == phase}
        rows: dict[int, list[dict[str, Any]]] = {}
        for i in insts:
            if i.step in chosen:
                nominal = cfg.nominal_s(r["stage"])[i.kind]
                rows.setdefault(i.step, []).append({"clock": nominal * i.kernel_s / i.work_s, "kernel": i.kernel_s})
        by_stage[r["stage"]] = rows
    common = set.intersection(*(set(rows) for rows in by_stage.values()))
    clock, kernel = [], []
    for step in sorted(common):
        for key, out in (("clock", clock), ("kernel", kernel)):
            d = np.array([x[key] for stage in range(frontier.schedule.num_stages) for x in by_stage[stage][step]])
            out.append(float(longest_path_finish(dag, d).max()))
    return statistics.median(clock), statistics.median(kernel)


def _diff(row: dict[str, Any], field: str) -> float:
    """Deployed minus baseline per iteration, the largest over ranks (the slowest stage sets the pace)."""
    values = []
    for _, dep, base in row["ranks"]:
        a, b = getattr(dep, field), getattr(base, field)
        if a is not None and b is not None:
            values.append(a - b)
    return max(values, default=0.0)


def _late(row: dict[str, Any]) -> tuple[float, float, float]:
    """Share of deployed instructions that started below their planned clock, the largest median
    and largest lateness over ranks, and the share that started above it."""
    deps: list[Breakdown] = [dep for _, dep, _ in row["ranks"]]
    n = sum(d.instructions for d in deps)
    share = sum(d.late_share * d.instructions for d in deps) / n if n else 0.0
    faster = sum(d.faster_share * d.instructions for d in deps) / n if n else 0.0
    row["faster"] = faster
    return share, max(d.late_median_s for d in deps), max(d.late_max_s for d in deps)


def _stat(values: list[float], scale: float = 100.0, unit: str = "%", digits: int = 1) -> str:
    v = [scale * x for x in values]
    return f"{statistics.median(v):+.{digits}f} {unit} ({min(v):+.{digits}f}..{max(v):+.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latencies-ms", default="0,5,20")
    parser.add_argument("--planner-knows-latency", choices=["on", "off"], default="on")
    args = parser.parse_args(argv)
    latencies = [float(x) / 1e3 for x in args.latencies_ms.split(",")]
    knows = args.planner_knows_latency == "on"
    table: list[tuple[float, list[dict[str, Any]]]] = []
    for latency in latencies:
        rows = []
        for i in range(args.runs):
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="perseus-bench-latency-") as tmp:
                row = one_run(args.stages, args.microbatches, Path(tmp), latency, knows)
            rows.append(row)
            share, late_med, _ = _late(row)
            print(f"latency {latency * 1e3:g} ms, run {i + 1}: wall: saving {100 * row['saving']:5.1f} %, time "
                  f"{100 * row['time']:+5.1f} %  model: saving {100 * row['true_saving']:5.1f} %, time "
                  f"{100 * row['true_time']:+5.2f} % (as applied {100 * row['applied_time']:+5.2f} %)  late "
                  f"{100 * share:4.1f} % (median {1e3 * late_med:.1f} ms), faster than planned {100 * row['faster']:4.1f} %  per iteration, deployed - baseline: "
                  f"stretch {1e3 * _diff(row, 'stretch_s'):+.1f} ms, overshoot {1e3 * _diff(row, 'overshoot_s'):+.1f} ms, "
                  f"hooks {1e3 * _diff(row, 'hook_s'):+.2f} ms, controller CPU {1e3 * _diff(row, 'controller_cpu_s'):+.1f} ms "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        table.append((latency, rows))
    print(f"\nmegatron-core demo, {args.stages} stages x {args.microbatches} microbatches, {args.runs} runs per latency, "
          f"switch ahead on, planner knows the latency: {args.planner_knows_latency}; median (min..max)")
    print(f"{'latency':<9}{'wall: time':>26}{'wall: saving':>26}{'model: time':>24}{'model as applied':>24}"
          f"{'model: saving':>24}{'late (slower) starts':>24}{'faster starts':>24}")
    for latency, rows in table:
        print(f"{latency * 1e3:>4g} ms  {_stat([r['time'] for r in rows]):>26}{_stat([r['saving'] for r in rows]):>26}"
              f"{_stat([r['true_time'] for r in rows], digits=2):>24}{_stat([r['applied_time'] for r in rows], digits=2):>24}"
              f"{_stat([r['true_saving'] for r in rows]):>24}{_stat([_late(r)[0] for r in rows]):>24}"
              f"{_stat([r['faster'] for r in rows]):>24}")
    print("\ndecomposition, per iteration, deployed minus baseline (ms): median (min..max)")
    print("wall = kernels' path at nominal work (clocks as they were, late switches included) + CPU work in "
          "kernels beyond the nominal time + host (between kernels: framework, hooks, wake-ups, load)")
    print(f"{'latency':<9}{'wall':>24}{'clocks':>24}{'kernel CPU beyond nominal':>28}{'host':>24}")
    for latency, rows in table:
        parts = [[r["wall_diff_s"] for r in rows], [r["clock_path_diff_s"] for r in rows],
                 [r["kernel_path_diff_s"] - r["clock_path_diff_s"] for r in rows],
                 [r["wall_diff_s"] - r["kernel_path_diff_s"] for r in rows]]
        print(f"{latency * 1e3:>4g} ms  " + "".join(f"{_stat(p, 1e3, 'ms', 1):>{w}}" for p, w in
                                                     zip(parts, (24, 24, 28, 24))))
    print("\nper iteration, deployed minus baseline, slowest stage (ms): median (min..max); baseline iteration "
          "for scale")
    print(f"{'latency':<9}{'iteration':>22}{'kernel stretch':>24}{'sleep overshoot':>24}{'hooks':>24}"
          f"{'controller CPU':>24}{'trainer CPU':>24}{'late switch (median)':>24}")
    for latency, rows in table:
        def ms(field: str) -> str:
            return _stat([_diff(r, field) for r in rows], 1e3, "ms", 2)
        print(f"{latency * 1e3:>4g} ms  {_stat([r['base_time_s'] for r in rows], 1e3, 'ms', 1):>22}"
              f"{ms('stretch_s'):>24}{ms('overshoot_s'):>24}{ms('hook_s'):>24}{ms('controller_cpu_s'):>24}"
              f"{ms('trainer_cpu_s'):>24}{_stat([_late(r)[1] for r in rows], 1e3, 'ms', 1):>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
