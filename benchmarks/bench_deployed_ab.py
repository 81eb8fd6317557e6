"""The deployed plan's same-run A/B, on a padded and an unpadded pipeline, several runs each.

Issue 24: Perseus promises less energy at no slowdown, and checks it while training (the closed
loop, docs/runtime.md "No slowdown, checked while training"). This measures what that gives: each
run deploys with default profiling settings (iterations to deployment reported), runs default-
clock probes every ``--probe-every`` deployed steps, and its own metrics file gives the A/B:
counted plan steps of the point it ended on against the counted probes of the same run (medians,
robust spread: ``perseus.runtime.guard.ab``), the time change and the energy saving, and what the guard
decided (``tests/guard_checks.py``'s verdict, which also checks the decisions follow the evidence).

Workloads (2 stages under torchrun on CPU, simulated GPUs):

- ``padded``: the DeepSpeed demo (``perseus_demo.deepspeed_demo``), each instruction padded to a
  nominal kernel time stretched by the clock, as a GPU kernel is: the clock's effect dominates CPU
  noise.
- ``unpadded``: the DeepSpeedExamples-style AlexNet script (``tests/deepspeed/alexnet_pipe_train.py``),
  the README's minimal ``"perseus"`` section; its CPU work does not slow down with the clock.

Usage: ``python benchmarks/bench_deployed_ab.py [--runs 3] [--workloads padded,unpadded] [--hogs 0]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests", ROOT / "tests" / "deepspeed"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from cpu_hog import cpu_hog
from guard_checks import check_guard_run, split_run

from perseus.runtime.guard.ab import ab_figure


def run_padded(out: Path, deployed_steps: int, probe_every: int) -> list[dict[str, Any]]:
    """The DeepSpeed demo, 2 stages, default profiling settings; rank 0's metrics-file lines."""
    from perseus_demo.deepspeed_demo import DemoConfig, launch

    metrics = out / "metrics.jsonl"
    perseus = {"straggler_period_steps": 0, "log_every_steps": 0, "planner_nice": 0, "cache_dir": str(out / "cache"),
               "metrics_file": str(metrics), "probe_every_steps": probe_every}
    cfg = DemoConfig(stages=2, microbatches=4, max_steps=400, deployed_steps=deployed_steps, rebaseline_steps=0,
                     perseus=perseus)
    launch(cfg, out / "run")
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def run_unpadded(out: Path, deployed_steps: int, probe_every: int) -> list[dict[str, Any]]:
    """The AlexNet script, the minimal section; long enough for ``deployed_steps`` after a deployment
    at about step 50 (its lines say where it deployed)."""
    from unpadded_workload import MINIMAL, run_beside_cpu_hog

    run = run_beside_cpu_hog(out, 50 + deployed_steps, {"probe_every_steps": probe_every}, base=MINIMAL, hog=False,
                             timeout_s=900.0)
    if run.returncode != 0:
        raise RuntimeError(f"the AlexNet run failed:\n{run.log[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def measure(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's row: iterations to deployment, the final point's A/B, the guard's verdict."""
    steps, events = split_run(lines)
    deployed = [r for r in steps if r["phase"] == "deployed"]
    if not deployed:
        return {"deployed_at": None}
    first = deployed[0]["step"]
    overhead = next((e["data"] for e in events if e["event"] == "profiling_overhead"), {})
    moves = [e["step"] for e in events if e["event"] == "guard" and e["data"]["action"] == "faster"]
    last_move = moves[-1] if moves else first - 1
    counted = [r for r in deployed if r.get("counted")]  # the file marks each step's role (clocks, counted)
    plan = [r for r in counted if r["clocks"] == "plan" and r["step"] > last_move]
    probes = [r for r in counted if r["clocks"] == "default"]
    row: dict[str, Any] = {"deployed_at": first, "profiling_iterations": overhead.get("iterations"),
                           "n_plan": len(plan), "n_probe": len(probes)}
    if plan and probes:
        ab = ab_figure([r["time_s"] for r in plan], [r["energy_j"] for r in plan],
                       [r["time_s"] for r in probes], [r["energy_j"] for r in probes])
        row.update(time=ab.time_change, time_se=ab.time_stderr, saving=ab.saving, saving_se=ab.saving_stderr,
                   plan_s=median(r["time_s"] for r in plan), probe_s=median(r["time_s"] for r in probes))
    try:
        verdict = check_guard_run(steps, events)
        row["guard"] = f"{verdict.outcome}, {verdict.windows} windows, {verdict.moves} moves"
    except AssertionError as err:
        row["guard"] = f"CHECK FAILED: {str(err).splitlines()[0][:120]}"
    return row


def _pct(value: float | None, se: float | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}%" + ("" if se is None else f" ± {100 * se:.1f}")


def _spread(rows: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return "-"
    return f"{100 * median(values):+.1f}% ({100 * min(values):+.1f}..{100 * max(values):+.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", default="padded,unpadded")
    parser.add_argument("--deployed-steps", type=int, default=60)
    parser.add_argument("--probe-every", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=0, help="busy processes beside the runs")
    args = parser.parse_args(argv)
    runners = {"padded": run_padded, "unpadded": run_unpadded}
    table: list[tuple[str, list[dict[str, Any]]]] = []
    with ExitStack() as stack:
        for _ in range(args.hogs):
            stack.enter_context(cpu_hog())
        for name in args.workloads.split(","):
            rows = []
            for i in range(args.runs):
                started = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="perseus-bench-ab-") as tmp:
                    row = measure(runners[name](Path(tmp), args.deployed_steps, args.probe_every))
                rows.append(row)
                print(f"{name} run {i + 1}: {row} ({time.perf_counter() - started:.0f} s)", flush=True)
            table.append((name, rows))
    print(f"\n2 stages, {args.runs} runs each, {args.hogs} busy processes beside, probes every {args.probe_every} "
          f"deployed steps; A/B: plan steps of the final point vs the same run's default-clock probes "
          f"(medians ± robust stderr; time + = slower, saving + = less energy)")
    header = f"{'workload':<10}{'run':>4}{'deployed at':>12}{'profiled':>9}{'plan/probe':>11}{'plan s':>8}" \
             f"{'probe s':>8}{'time':>22}{'energy saving':>22}  guard"
    print(header)
    for name, rows in table:
        for i, r in enumerate(rows, 1):
            if r.get("deployed_at") is None:
                print(f"{name:<10}{i:>4}  never deployed")
                continue
            print(f"{name:<10}{i:>4}{r['deployed_at']:>12}{r['profiling_iterations'] or '-':>9}"
                  f"{r['n_plan']:>6}/{r['n_probe']:<4}{r.get('plan_s', 0):>8.3f}{r.get('probe_s', 0):>8.3f}"
                  f"{_pct(r.get('time'), r.get('time_se')):>22}{_pct(r.get('saving'), r.get('saving_se')):>22}  "
                  f"{r['guard']}")
        print(f"{name:<10}{'all':>4}{'':>12}{'':>9}{'':>11}{'':>8}{'':>8}{_spread(rows, 'time'):>22}"
              f"{_spread(rows, 'saving'):>22}  median (min..max)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
