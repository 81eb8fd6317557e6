#!/usr/bin/env python
"""Clock-switch latency: the demo's A/B/A per pipeline shape and latency, with the latency hidden.

    python benchmarks/bench_switch_latency.py                      # 2x4 and 4x8, 0/5/20 ms, 3 runs each
    python benchmarks/bench_switch_latency.py --shapes 2x4 --latencies-ms 5 --runs 1
    python benchmarks/bench_switch_latency.py --hiding off         # the planner and runtime ignore the latency
    python benchmarks/bench_switch_latency.py --json               # the measured latency, one JSON object

``--json`` drives the real runtime in one process (``PerseusRuntime`` on a one-stage 1F1B job, 8
microbatches, forward 10 ms and backward 20 ms of max-clock work, a 30 ms tail per step) on the
asynchronous simulated H200 whose clock switches land ``--latency-ms`` (10) after they are asked
for, with no latency configured: profiling measures it (``GPUPort.apply`` watches each swept
clock change land) and records it in the profile, the planner and the GPU timeline's request lead
take it, and the plan is deployed at a target time ``--slowdown`` (1.1) x the baseline's, so its
point switches clocks. Then the same plan again from the cache with ``switch_ahead: false`` (the
runtime ignores the measured latency: a lead of 0, as before it was measured). Printed:
``latency_calibration_error`` (|measured - simulated| / simulated), ``own_clock_share`` (deployed
plan instructions that started at their own clock, from the simulated GPU's kernel record,
``SimStream.kernels()``; the share of those whose clock differs from the previous one's too), and
the same shares without the lead. Acceptance: calibration error <= 0.3, own-clock share >= 0.95.

Each run is ``perseus_demo.megatron_demo`` (real megatron-core on CPU, simulated GPUs whose clock
switches land the given latency after they are requested) with ``trace_clocks`` on: profiling,
planning, the deployed no-slowdown plan, then default clocks re-measured (A/B/A). With hiding on,
``planner_options.switch_latency_s`` is the latency: the planner keeps only plans whose switches
can land between their instructions, and the runtime asks for each switch that long before
(docs/runtime.md, "Clock-switch latency").

Printed per shape and latency, median and spread (min..max) over runs, deployed against baseline:

- wall: iteration time and energy as measured (the machine's load is in these);
- model, traced: the simulated GPU's own accounting of what ran, independent of load: every
  kernel's nominal work at the clocks it really had (a switch landing inside it included:
  ``clock_trace.kernel_on_model``), the iteration as the kernels' longest path through the
  schedule, blocking power while a stage waits;
- model, plan: the deployed plan on the GPU model with switches landing as the runtime times them
  (``perseus.timeline.switch_lag``; what the planner promises), and the share of instructions that started
  below (late switch up) or above (late switch down) their planned clock.

Then whether the targets hold (median wall slowdown at most +1 %, saving within 2 points of the
zero-latency saving, on the wall clock and on the traced model), and where the deployed plan's
time went (decomposition from the traces). The load average is printed before and after: wall-
clock numbers depend on it; tests never assert them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np
from demo_ab import DemoRun, run_demo
from demo_checks import cached_profile, traced_on_model, traced_steps, true_profile

from perseus.schedules.dag import InstructionDAG
from perseus.runtime.port.clock_trace import Breakdown, breakdown, from_dict
from perseus.timeline.simulator import longest_path_finish, max_frequency_plan, simulate_plan
from perseus.timeline.switch_lag import simulate_with_latency

DEPLOYED, BASELINE = "deployed", "stopped"  # the clock trace's phase labels (stopped: default clocks again)
SLOWDOWN_TARGET, SAVING_POINTS = 0.01, 0.02


def traced(run: DemoRun, phase: str) -> dict[str, float]:
    """Medians over the phase's steps: the model's iteration time and energy from the traced clocks,
    and the kernels' longest path with their nominal work at those clocks ("clocks") and with
    their actual durations ("kernels", CPU work beyond the nominal time included)."""
    dag = InstructionDAG.from_schedule(run.frontier.schedule)
    time_s, energy_j = traced_on_model(run.results, run.cfg, run.cache_dir, phase)
    clocks, kernels = [], []
    for nodes in traced_steps(run.results, phase).values():
        nominal = np.array([run.cfg.nominal_s(s)[i.kind] * (i.kernel_s or 0.0) / (i.work_s or 1.0)
                            for s, i in zip(dag.node_stage.tolist(), nodes)])
        clocks.append(float(longest_path_finish(dag, nominal).max()))
        kernels.append(float(longest_path_finish(dag, np.array([i.kernel_s or 0.0 for i in nodes])).max()))
    return {"time_s": time_s, "energy_j": energy_j, "clocks_s": statistics.median(clocks),
            "kernels_s": statistics.median(kernels)}


def predicted(run: DemoRun, latency_s: float, hiding: bool) -> dict[str, float]:
    """The deployed plan on the GPU model with switches landing as the runtime asks for them."""
    dag = InstructionDAG.from_schedule(run.frontier.schedule)
    measured = cached_profile(run.cache_dir)
    truth = true_profile(run.cfg, measured.entries)
    base = simulate_plan(dag, truth, max_frequency_plan(dag, truth))
    lag = simulate_with_latency(dag, truth, run.frontier.default_point().freqs_mhz, latency_s,
                                "timed" if hiding else "ahead", planned=measured)
    return {"time": lag.time_s / base.time_s - 1.0, "saving": 1.0 - lag.energy_j / base.energy_j}


def analyse(run: DemoRun, latency_s: float, hiding: bool) -> dict[str, Any]:
    row: dict[str, Any] = dict(run.numbers)
    dep, base = traced(run, DEPLOYED), traced(run, BASELINE)
    row["model_time"] = dep["time_s"] / base["time_s"] - 1.0
    row["model_saving"] = 1.0 - dep["energy_j"] / base["energy_j"]
    row["clock_path_diff_s"] = dep["clocks_s"] - base["clocks_s"]
    row["kernel_path_diff_s"] = dep["kernels_s"] - base["kernels_s"]
    pred = predicted(run, latency_s, hiding)
    row["plan_time"], row["plan_saving"] = pred["time"], pred["saving"]
    ranks: list[tuple[int, Breakdown, Breakdown]] = []
    for r in run.results:
        insts, steps = from_dict(r["summary"]["clock_trace"])
        ranks.append((r["stage"], breakdown(insts, steps, lambda p: p == DEPLOYED),
                      breakdown(insts, steps, lambda p: p == BASELINE)))
    row["ranks"] = ranks
    deps = [d for _, d, _ in ranks]
    n = sum(d.instructions for d in deps) or 1
    row["late"] = sum(d.late_share * d.instructions for d in deps) / n
    row["faster"] = sum(d.faster_share * d.instructions for d in deps) / n
    row["late_median_s"] = max(d.late_median_s for d in deps)
    return row


def _diff(row: dict[str, Any], field: str) -> float:
    """Deployed minus baseline per iteration, the largest over ranks (the slowest stage sets the pace)."""
    values = [getattr(dep, field) - getattr(base, field) for _, dep, base in row["ranks"]
              if getattr(dep, field) is not None and getattr(base, field) is not None]
    return max(values, default=0.0)


def _stat(values: list[float], scale: float = 100.0, unit: str = "%", digits: int = 1) -> str:
    v = [scale * x for x in values]
    return f"{statistics.median(v):+.{digits}f} {unit} ({min(v):+.{digits}f}..{max(v):+.{digits}f})"


def _load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def print_shape(shape: str, table: list[tuple[float, list[dict[str, Any]]]], runs: int, hiding: bool) -> list[str]:
    """The shape's tables; returns its lines for the targets summary."""
    print(f"\n== megatron-core demo {shape} (stages x microbatches), {runs} run(s) per latency, latency hiding "
          f"{'on' if hiding else 'off'}; deployed vs baseline, median (min..max)")
    print(f"{'latency':<9}{'wall: time':>24}{'wall: saving':>24}{'model traced: time':>24}{'model traced: saving':>24}"
          f"{'model plan: saving':>22}{'late starts':>22}{'faster starts':>22}")
    for latency, rows in table:
        print(f"{latency * 1e3:>4g} ms  {_stat([r['time'] for r in rows]):>24}{_stat([r['saving'] for r in rows]):>24}"
              f"{_stat([r['model_time'] for r in rows], digits=2):>24}{_stat([r['model_saving'] for r in rows]):>24}"
              f"{_stat([r['plan_saving'] for r in rows]):>22}{_stat([r['late'] for r in rows]):>22}"
              f"{_stat([r['faster'] for r in rows]):>22}")
    print("\nwhere the time went, per iteration, deployed minus baseline (ms): wall = kernels' path at nominal work "
          "(clocks as they were) + CPU work in kernels beyond the nominal time + host (between kernels)")
    print(f"{'latency':<9}{'wall':>24}{'clocks':>24}{'kernel CPU beyond nominal':>28}{'host':>24}"
          f"{'hooks':>22}{'sleep overshoot':>22}{'controller CPU':>22}")
    for latency, rows in table:
        parts = [[r["wall_diff_s"] for r in rows], [r["clock_path_diff_s"] for r in rows],
                 [r["kernel_path_diff_s"] - r["clock_path_diff_s"] for r in rows],
                 [r["wall_diff_s"] - r["kernel_path_diff_s"] for r in rows]]
        measured = [[_diff(r, f) for r in rows] for f in ("hook_s", "overshoot_s", "controller_cpu_s")]
        print(f"{latency * 1e3:>4g} ms  " + "".join(f"{_stat(p, 1e3, 'ms', 1):>{w}}" for p, w in zip(parts, (24, 24, 28, 24)))
              + "".join(f"{_stat(p, 1e3, 'ms', 1):>22}" for p in measured))
    zero = next((rows for latency, rows in table if latency == 0), None)
    lines = []
    for latency, rows in table:
        wall_time = statistics.median(r["time"] for r in rows)
        verdict = [f"{shape} {latency * 1e3:g} ms: median wall slowdown {100 * wall_time:+.1f} % "
                   f"({'met' if wall_time <= SLOWDOWN_TARGET else 'NOT met'})"]
        if zero is not None and latency > 0:
            for name, key in (("wall", "saving"), ("model traced", "model_saving"), ("model plan", "plan_saving")):
                behind = statistics.median(r[key] for r in zero) - statistics.median(r[key] for r in rows)
                verdict.append(f"{name} saving {100 * statistics.median(r[key] for r in rows):.1f} %, "
                               f"{100 * behind:+.1f} points behind 0 ms ({'met' if behind <= SAVING_POINTS else 'NOT met'})")
        lines.append("; ".join(verdict))
    return lines


# ---------------------------------------------------------------- --json: the measured latency, real runtime

WORK = {"forward": 0.010, "backward": 0.020}
TAIL_S = 0.030
MICROBATCHES = 8


def _train(rt: Any, steps: int, until: Any = None) -> None:
    """``steps`` steps (or until ``until(rt)``): each instruction's kernel its nominal work, the tail after."""
    kernels = rt.sim_kernels
    for _ in range(steps):
        rt.on_step_begin()
        for inst in rt.schedule.stages[0]:
            rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            kernels.pad(WORK[inst.kind])
            rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        kernels.device.stream.launch(TAIL_S, activity=0.5, tag="tail")
        rt.on_step_end()
        if until is not None and until(rt):
            return


def _deployed_shares(rt: Any, steps: int, slowdown: float) -> dict[str, Any]:
    """``steps`` steps at the target time ``slowdown`` x the baseline: the share of the plan's
    instructions that started at their own clock (the first of a step is set between steps: not
    counted), over all of them and over those whose clock differs from the previous one's."""
    from perseus.runtime.phases import Phase

    assert rt.phase is Phase.DEPLOYED and rt.frontier is not None
    rt.set_target_time(rt.frontier.default_point().time_s * slowdown)
    _train(rt, 2)  # the new point from the next step on
    gpu = rt.gpu.sim_device
    skip = len(gpu.stream.kernels())
    first = len(rt.reporter.records)
    _train(rt, steps)
    gpu.stream.synchronize()
    clocks = rt.stage_clocks()
    kernels, per_step, current = gpu.stream.kernels()[skip:], [], []
    for k in kernels:
        if k.tag == "tail":
            per_step.append(current)
            current = []
        else:
            current.append(k)
    own = total = own_switched = switched = 0
    for rec, ks in zip(rt.reporter.records[first:], per_step):
        if rec.clocks != "plan":
            continue
        for i in range(1, len(ks)):
            hit = ks[i].set_mhz == clocks[i]
            own, total = own + hit, total + 1
            if clocks[i] != clocks[i - 1]:
                own_switched, switched = own_switched + hit, switched + 1
    return {"own_clock_share": own / max(total, 1), "switched_own_clock_share": own_switched / max(switched, 1),
            "switches_per_step": sum(a != b for a, b in zip(clocks, clocks[1:])), "plan_instructions": total}


def runtime_bench(latency_s: float, slowdown: float, steps: int, depth: int = 6) -> dict[str, Any]:
    """Profile, plan and deploy on the simulated H200 with a ``latency_s`` switch latency, nothing
    configured; then the same plan with the runtime ignoring the latency (``switch_ahead: false``)."""
    from perseus.gpu.sim.device import SimulatedGPU
    from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
    from perseus.runtime.phases import Phase

    job = PipelineJob(num_stages=1, num_microbatches=MICROBATCHES, stage=0)
    with tempfile.TemporaryDirectory(prefix="perseus-bench-latency-") as tmp:
        d = Path(tmp)
        SimulatedGPU(0, preset="H200", state_dir=d / "sim", reset_state=True, stream_depth=depth,
                     switch_latency_s=latency_s).close()
        settings = {"gpu": "sim", "device_index": 0, "cache_dir": str(d / "cache"), "warmup_steps": 2,
                    "p_blocking_w": 110.0, "log_every_steps": 0, "straggler_period_steps": 0,
                    "probe_every_steps": 0, "plan_wait_s": 60.0, "freq_min_mhz": 1005, "freq_max_mhz": 1530,
                    "freq_step_mhz": 75, "iters_per_freq": 3, "remeasure_max": 0, "planner_nice": 0,
                    "sim_gpu": {"state_dir": str(d / "sim"), "stream_depth": depth}}
        started = time.perf_counter()
        with PerseusRuntime(job, PerseusConfig.from_dict(settings)) as rt:
            _train(rt, 200, until=lambda r: r.phase is Phase.DEPLOYED)
            profile = rt.supply.profile
            assert profile is not None and profile.switch_latency is not None, "no latency measured"
            chosen = rt.supply.switch_latency
            cached = rt.supply.cache.load_frontier(rt.schedule) if rt.supply.cache is not None else None
            planned_s = cached.metadata.get("switch_latency_s") if cached is not None else None
            hidden = _deployed_shares(rt, steps, slowdown)
        with PerseusRuntime(job, PerseusConfig.from_dict({**settings, "switch_ahead": False})) as rt:
            _train(rt, 20, until=lambda r: r.phase is Phase.DEPLOYED)
            unhidden = _deployed_shares(rt, steps, slowdown)
    measured = profile.switch_latency
    return {
        "simulated_latency_s": latency_s,
        "measured_latency_s": measured.seconds,
        "measured_switches": measured.samples,
        "latency_calibration_error": abs(measured.seconds - latency_s) / latency_s,
        "latency_source": chosen.source if chosen is not None else None,
        "planner_switch_latency_s": planned_s,
        "target_slowdown": slowdown,
        **hidden,
        "own_clock_share_without_lead": unhidden["own_clock_share"],
        "switched_own_clock_share_without_lead": unhidden["switched_own_clock_share"],
        "wall_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="2x4,4x8", help="stages x microbatches, comma-separated")
    parser.add_argument("--latencies-ms", default="0,5,20")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hiding", choices=["on", "off"], default="on",
                        help="tell the planner and the runtime the latency (planner_options.switch_latency_s)")
    parser.add_argument("--json", action="store_true",
                        help="the measured latency on the real runtime (asynchronous simulated H200): one JSON object")
    parser.add_argument("--latency-ms", type=float, default=10.0, help="--json: the simulated switch latency")
    parser.add_argument("--slowdown", type=float, default=1.1, help="--json: the deployed target time x baseline")
    parser.add_argument("--steps", type=int, default=12, help="--json: deployed steps counted per run")
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(runtime_bench(args.latency_ms / 1e3, args.slowdown, args.steps), indent=1))
        return 0
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")]
    latencies = [float(x) / 1e3 for x in args.latencies_ms.split(",")]
    hiding = args.hiding == "on"
    started_all = time.perf_counter()
    print(f"start: {_load()}", flush=True)
    summary: list[str] = []
    for stages, microbatches in shapes:
        shape = f"{stages}x{microbatches}"
        table: list[tuple[float, list[dict[str, Any]]]] = []
        for latency in latencies:
            rows = []
            for i in range(args.runs):
                started = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="perseus-bench-latency-") as tmp:
                    run = run_demo(Path(tmp), stages=stages, microbatches=microbatches, latency_s=latency,
                                   planner_knows=hiding, trace_clocks=True)
                    row = analyse(run, latency, hiding)
                rows.append(row)
                print(f"{shape}, latency {latency * 1e3:g} ms, run {i + 1}: wall: time {100 * row['time']:+5.1f} %, "
                      f"saving {100 * row['saving']:5.1f} %  model traced: time {100 * row['model_time']:+5.2f} %, "
                      f"saving {100 * row['model_saving']:5.1f} %  model plan: saving {100 * row['plan_saving']:5.1f} % "
                      f"(no latency {100 * row['true_saving']:5.1f} %)  late {100 * row['late']:4.1f} %, faster "
                      f"{100 * row['faster']:4.1f} %  ({time.perf_counter() - started:.0f} s, {_load()})", flush=True)
            table.append((latency, rows))
        summary += print_shape(shape, table, args.runs, hiding)
    print(f"\ntargets (latency hiding {'on' if hiding else 'off'}): median wall slowdown <= +1 %, saving within 2 points "
          f"of the zero-latency saving")
    for line in summary:
        print("  " + line)
    print(f"end: {_load()}; {time.perf_counter() - started_all:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
