"""Profiling cost, before and after issue 24: iterations, time and energy overhead of the sweep,
and what it means for a GPT-3-scale run.

Part 1 runs the real runtime in one process on a simulated A100 (its DVFS curve; instructions of
a nominal 3/6 ms at the max clock, 4 microbatches, 1 stage) through warm-up and profiling with:

- "before, no early stop": today's defaults as the issue saw them on a noisy node: every clock
  1410..210 MHz, 2 iterations each, the early stop never triggering (patience 0);
- "before": today's sweep on a quiet curve: every clock, 2 iterations, patience 2;
- "after": the defaults now (coarse 90 MHz pass to where energy stops falling, refinement,
  interpolation, 3 iterations per clock, a slow first one dropped).

Overhead = the profiling steps' time and energy minus the warm-up median × as many steps
(``perseus.runtime.observe.report.profiling_overhead``), as a share of one default-clock iteration.

Part 2 models a GPT-3-scale job: 10 s iterations at the max clock (compute-bound share 0.8 on the
same curve), a 24-hour run. Profiling time/energy overhead comes from the clocks each sweep
visited (iterations × the curve), P_blocking measurement 2 s, planning on a niced process while
training goes on at default clocks (no overhead, only iterations before deployment). A negative
energy overhead means the low clocks of the sweep used less energy than default clocks did. Iterations
to deployment for a 2-stage script: warm-up + profiling + ceil(planning time / iteration time),
with the planning time measured here on the profile the "after" sweep produced (2 stages, 1F1B,
8 microbatches).

    python benchmarks/bench_profiling_cost.py
"""

from __future__ import annotations

import logging
import math
import sys
import tempfile
import time
from pathlib import Path

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import get_preset
from perseus.planner import plan_frontier
from perseus.profile import Profile
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.schedules import build_schedule

MODEL = get_preset("A100-SXM")
T_MAX = {"forward": 0.003, "backward": 0.006}
JOB = PipelineJob(num_stages=1, num_microbatches=4, stage=0)
SETTINGS = {
    "before, no early stop": {"iters_per_freq": 2, "early_stop_patience": 0, "coarse_step_mhz": None,
                              "refine_max_clocks": 0, "remeasure_max": 0},
    "before": {"iters_per_freq": 2, "early_stop_patience": 2, "coarse_step_mhz": None, "refine_max_clocks": 0,
               "remeasure_max": 0},
    "after": {},
}
GPT3_ITER_S = 10.0
RUN_S = 24 * 3600.0
WARMUP = 2


def sweep(settings: dict, root: Path) -> tuple[dict, Profile]:
    """Warm-up and profiling on the simulated A100; the runtime's summary and profile."""
    SimulatedGPU(0, state_dir=str(root / "sim"), energy_update_period_s=0.0, reset_state=True)
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": None, "mode": "profile",
                                   "sim_gpu": {"state_dir": str(root / "sim")}, "p_blocking_w": MODEL.p_blocking_w,
                                   "warmup_steps": WARMUP, "log_every_steps": 0, **settings})
    with PerseusRuntime(JOB, cfg) as rt:
        for _ in range(400):
            if rt.phase.value not in ("warmup", "profiling"):
                break
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                rt.sim_kernels.pad(T_MAX[inst.kind])
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            rt.on_step_end()
        summary = rt.summary()
        summary["_records"] = [r for r in rt.reporter.records if r.phase == "profiling"]
        assert rt._profile is not None
        return summary, rt._profile


def gpt3_model(summary: dict) -> dict:
    """Overhead of the same sweep on 10 s iterations: each profiled iteration at its clock."""
    per_clock = {}
    for r in summary["_records"]:
        per_clock.setdefault(r.freq_mhz, 0)
        per_clock[r.freq_mhz] += 1
    t_max, e_max = GPT3_ITER_S, MODEL.kernel_energy_j(GPT3_ITER_S, MODEL.sm_max_mhz, 1.0, 0.8)
    extra_t = sum(n * (MODEL.kernel_time_s(GPT3_ITER_S, f, 0.8) - t_max) for f, n in per_clock.items()) + 2.0
    extra_e = sum(n * (MODEL.kernel_energy_j(GPT3_ITER_S, f, 1.0, 0.8) - e_max) for f, n in per_clock.items())
    iters = RUN_S / t_max
    return {"extra_time_pct": 100 * extra_t / RUN_S, "extra_energy_pct": 100 * extra_e / (iters * e_max),
            "profiling_hours": sum(n * MODEL.kernel_time_s(GPT3_ITER_S, f, 0.8) for f, n in per_clock.items()) / 3600}


def planning_seconds(profile: Profile) -> float:
    two = Profile({(s, c, k): v for (_, c, k), v in profile.entries.items() for s in (0, 1)}, profile.p_blocking_w,
                  profile.gpu_name)
    started = time.perf_counter()
    plan_frontier(build_schedule("1f1b", 2, 8), two)
    return time.perf_counter() - started


def main() -> int:
    logging.getLogger("perseus").setLevel(logging.WARNING)
    rows = {}
    after_profile = None
    for name, settings in SETTINGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            summary, profile = sweep(settings, Path(tmp))
        if name == "after":
            after_profile = profile
        rows[name] = summary
    assert after_profile is not None
    plan_s = planning_seconds(after_profile)
    print(f"simulated {MODEL.name}; nominal iteration {1e3 * 4 * sum(T_MAX.values()):.0f} ms at {MODEL.sm_max_mhz} MHz\n")
    head = f"{'sweep':<22} {'clocks':>6} {'lowest':>7} {'iters':>6} {'+time (it)':>11} {'+energy (it)':>13} " \
           f"{'GPT-3 time %':>13} {'GPT-3 energy %':>15} {'to deploy':>10}"
    print(head)
    print("-" * len(head))
    before = None
    for name, s in rows.items():
        o = s["profiling_overhead"]
        measured = sorted(set(s["profiled_clocks_mhz"]))
        gpt = gpt3_model(s)
        deploy = s["profiling_iterations"] + math.ceil(plan_s / 2.0)  # a 2-stage script: ~2 s iterations
        print(f"{name:<22} {len(measured):>6} {min(measured):>7} {s['profiling_iterations']:>6} "
              f"{o['extra_time_s'] / s['baseline']['time_s']:>11.1f} {o['extra_energy_j'] / s['baseline']['energy_j']:>13.1f} "
              f"{gpt['extra_time_pct']:>13.2f} {gpt['extra_energy_pct']:>15.2f} {deploy:>10}")
        if name == "before, no early stop":
            before = (s, gpt)
    assert before is not None
    a, ga = rows["after"], gpt3_model(rows["after"])
    b, gb = before
    print(f"\n+time/+energy: profiling's extra time and energy in default-clock iterations (warm-up median); "
          f"'to deploy' adds ceil(planning {plan_s:.1f} s / 2 s) iterations of a 2-stage script")
    print(f"after / before(no early stop): iterations {a['profiling_iterations'] / b['profiling_iterations']:.2f}x, "
          f"extra time {a['profiling_overhead']['extra_time_s'] / b['profiling_overhead']['extra_time_s']:.2f}x, "
          f"GPT-3 time overhead {ga['extra_time_pct'] / gb['extra_time_pct']:.2f}x "
          f"(profiling {gb['profiling_hours']:.2f} h -> {ga['profiling_hours']:.2f} h of a 24 h run)")
    ok = ga["extra_time_pct"] < 2 and ga["extra_energy_pct"] < 2 and a["profiling_iterations"] + math.ceil(plan_s / 2.0) <= 40
    print("targets (GPT-3 < 2 % time and energy; <= 40 iterations to deployment):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
