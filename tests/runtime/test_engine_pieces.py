"""The engine's pieces alone, in one process: background planning, the job check, the summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from perseus.frontier import Frontier, FrontierPoint
from perseus.planner import PlannerOptions
from perseus.profile import InstructionProfile, uniform_profile
from perseus.runtime import PipelineJob
from perseus.runtime.supply import planning
from perseus.runtime.plane.collective import Collective
from perseus.runtime.clocks.job_check import check_job
from perseus.runtime.observe.metrics import StepMetrics
from perseus.runtime.phases import Phase
from perseus.runtime.observe.report import Reporter, RunFacts, summarize, summary_line
from perseus.schedules import build_schedule

sys.path.insert(0, str(Path(__file__).parent))
import planner_stand_ins as stand_ins

SCHEDULE = build_schedule("1f1b", 2, 2)
PROFILE = uniform_profile(2, {"forward": InstructionProfile((1400, 1000), (0.01, 0.012), (3.0, 2.5)),
                              "backward": InstructionProfile((1400, 1000), (0.02, 0.024), (6.0, 5.0))}, 50.0)


def _outcome(planner):
    for _ in range(20000):  # the planner process starts slowly on a loaded machine
        outcome = planning.share_outcome(Collective(), planner, SCHEDULE, 0)
        if outcome is not None:
            return outcome
        time.sleep(0.005)
    raise AssertionError("planning never finished")


def test_background_planner_shares_the_frontier_or_the_failure(monkeypatch):
    assert planning.share_outcome(Collective(), None, SCHEDULE, 0) is None  # no planner yet: pending
    outcome = _outcome(planning.BackgroundPlanner(SCHEDULE, PROFILE, PlannerOptions(num_anchors=4, num_deadlines=8)))
    assert outcome.error is None and outcome.plan is not None and outcome.planned is not None
    assert len(outcome.plan.points) == outcome.planned.num_points
    assert outcome.plan.stage == 0 and len(outcome.plan.instructions) == len(SCHEDULE.stages[0])

    # the planner runs in a child process: its function must be importable there
    monkeypatch.setattr(planning, "plan_frontier", stand_ins.broken)
    outcome = _outcome(planning.BackgroundPlanner(SCHEDULE, PROFILE, PlannerOptions()))
    assert outcome.plan is None and outcome.error == "ValueError: no luck"


def test_job_check_alone_sees_no_straggler_and_sums_energy():
    job = PipelineJob(num_stages=2, num_microbatches=2, stage=0)
    check = check_job(Collective(), job, 12, [(0.10, 2.0), (0.12, 4.0)], diverged_here=False)
    assert check.slowdown == 1.0 and not check.diverged
    assert check.numbers["energy_per_iteration_j"] == pytest.approx(3.0)
    assert check.numbers["pipeline_natural_time_s"] == {0: pytest.approx(0.11)} and check.numbers["step"] == 12
    assert check_job(Collective(), job, 12, [(0.1, 1.0)], diverged_here=True).diverged


def test_summary_is_built_from_values():
    reporter = Reporter(rank=1, log_every_steps=0)
    for step, phase, energy in ((0, "warmup", 10.0), (1, "warmup", 10.0), (2, "deployed", 8.0)):
        reporter.add(StepMetrics(step=step, rank=1, phase=Phase(phase), time_s=0.1, energy_j=energy))
    reporter.set_baseline(reporter.records[:2])
    frontier = Frontier(SCHEDULE, 50.0, 0.1, 10.0, [FrontierPoint(0.1, 9.0, np.full(8, 1400))])
    job = PipelineJob(num_stages=2, num_microbatches=2, stage=1, dp_rank=0)
    s = summarize(reporter, RunFacts(
        rank=1, job=job, mode="run", phase=Phase.DEPLOYED, steps=3,
        phase_history=[(0, Phase.WARMUP), (2, Phase.DEPLOYED)], p_blocking_w=50.0, fallback=None, slowdown=1.0,
        clock_mhz=1400, events=[], job_numbers={}, frontier=frontier, point=frontier.points[0]))
    assert s["saving"] == pytest.approx(0.2) and s["stage"] == 1 and "profiled_clocks_mhz" not in s
    assert s["phase"] == "deployed" and s["phase_history"] == [(0, "warmup"), (2, "deployed")]
    assert set(s["phases"]) == {"warmup", "deployed"}, "phase names, as the summary always had them"
    assert s["frontier"]["points"] == 1 and s["point"] == {"time_s": 0.1, "energy_j": 9.0}
    assert summary_line(s) == ("perseus summary: 3 steps, phase deployed, baseline 100.0 ms / 10.00 J, "
                               "deployed 100.0 ms / 8.00 J, saving 20.0%")
