"""Test helpers: the toy pipeline's exact profile (from the DVFS model) and a small real frontier.

The straggler, mismatch and safety tests need a frontier with more than one point independent of
the planner under development; ``stage_uniform_frontier`` enumerates one clock per stage (every
combination), simulates each plan on the profile, and keeps the Pareto-optimal ones. That is a
valid (if coarse) frontier: each point is a real plan with simulated time and energy.
"""

from __future__ import annotations

import itertools

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.sim.dvfs import get_preset
from perseus.profile import InstructionProfile, Profile
from toy_pipeline import ToyConfig
from perseus.schedules import build_schedule
from perseus.timeline.simulator import simulate_plan


def toy_profile(cfg: ToyConfig, freqs: list[int]) -> Profile:
    model = get_preset(cfg.sim_preset)
    entries = {}
    for s in range(cfg.num_stages):
        for c in range(cfg.num_chunks):
            for kind, ratio in (("forward", 1.0), ("backward", cfg.backward_ratio)):
                t_max = cfg.forward_s * cfg.weight(s) * ratio
                times = [model.kernel_time_s(t_max, f, cfg.compute_fraction) for f in freqs]
                energies = [model.kernel_energy_j(t_max, f, cfg.activity, cfg.compute_fraction) for f in freqs]
                entries[(s, c, kind)] = InstructionProfile(tuple(freqs), tuple(times), tuple(energies))
    return Profile(entries, model.p_blocking_w, model.name)


def stage_uniform_frontier(cfg: ToyConfig, freqs: list[int]) -> Frontier:
    profile = toy_profile(cfg, freqs)
    sched = build_schedule(cfg.schedule, cfg.num_stages, cfg.num_microbatches, cfg.num_chunks)
    dag = InstructionDAG.from_schedule(sched)
    plans = []
    for combo in itertools.product(freqs, repeat=cfg.num_stages):
        plan = np.array([combo[s] for s in dag.node_stage.tolist()], dtype=np.int64)
        sim = simulate_plan(dag, profile, plan)
        plans.append(FrontierPoint(sim.time_s, sim.energy_j, plan))
    plans.sort(key=lambda p: (p.time_s, p.energy_j))
    pareto: list[FrontierPoint] = []
    for p in plans:
        if not pareto or p.energy_j < pareto[-1].energy_j:
            pareto.append(p)
    all_max = simulate_plan(dag, profile, np.full(dag.num_nodes, max(freqs)))
    return Frontier(sched, profile.require_p_blocking(), all_max.time_s, all_max.energy_j, pareto, gpu_name=profile.gpu_name)


def greedy_frontier(schedule, profile, options=None, *, progress=None) -> Frontier:
    """Stand-in planner: lower single instructions' clocks while the iteration time does not grow.

    Returns the all-max point plus the greedy point: a real, if simple, no-slowdown plan, used to
    check that the runtime turns a planned saving into a measured one independently of the planner
    under development.
    """
    dag = InstructionDAG.from_schedule(schedule)
    options = [profile.get(s, i.kind, i.chunk).freqs_mhz for s, i in zip(dag.node_stage.tolist(), dag.instructions)]
    plan = np.array([o[0] for o in options], dtype=np.int64)
    base = simulate_plan(dag, profile, plan)
    best = base
    improved = True
    while improved:
        improved = False
        for v in range(dag.num_nodes):
            pos = options[v].index(int(plan[v]))
            if pos + 1 >= len(options[v]):
                continue
            trial = plan.copy()
            trial[v] = options[v][pos + 1]
            sim = simulate_plan(dag, profile, trial)
            if sim.time_s <= base.time_s * (1 + 1e-9) and sim.energy_j < best.energy_j:
                plan, best, improved = trial, sim, True
    points = [FrontierPoint(base.time_s, base.energy_j, np.array([o[0] for o in options], dtype=np.int64))]
    if best.energy_j < base.energy_j:
        points.append(FrontierPoint(best.time_s, best.energy_j, plan))
    return Frontier(schedule, profile.require_p_blocking(), base.time_s, base.energy_j, points, gpu_name=profile.gpu_name)


def greedy_frontier_held_back_in_first_attempt(schedule, profile, options=None, *, progress=None) -> Frontier:
    """``greedy_frontier``, 3 s late in a torchrun job's first attempt, so that a rank can die while
    rank 0 is still planning. Module level: the planner process imports it by name."""
    import os
    import time

    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        time.sleep(3.0)
    return greedy_frontier(schedule, profile, options)
