"""The guard also judges energy: a plan whose job-wide energy per step is not measurably lower than
the same run's default-clock probes' falls back and says so; an honest plan is kept; unmeasured
steps are left out, never counted as 0 J.

Synthetic runs (``simulate_energy``: a 2-stage pipeline driven as the closed loop drives it) for the
rates; the real runtime on a simulated GPU for what the run does and says.
"""

from __future__ import annotations

import json
import logging
import math
import time

import numpy as np
import pytest
from test_closed_loop import setup  # the same runtime on a simulated GPU (this folder)

from perseus.frontier import Frontier, FrontierPoint
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.guard.job_guard import RankGuard
from perseus.runtime.guard.placement import ProbePlacement
from perseus.runtime.guard.sequential import (
    Confidence,
    EnergySettings,
    EnergyTest,
    JobWindow,
    RankEnergy,
    job_window,
    rank_energy,
)
from perseus.runtime.guard.simulation import lognormal_noise, simulate_energy
from perseus.runtime.observe.report import summary_line
from perseus.schedules import build_schedule

NOISE = 0.02  # the step's shared noise; each stage adds its own 3 %: a stage's step energy varies by about 3.6 %
JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
SCHEDULE = build_schedule("1f1b", 1, 2)
MAX = 1410
EVERY = 8


def uniform(clock, time_s, energy_j):
    return FrontierPoint(time_s, energy_j, np.full(4, clock))


def test_a_plan_that_spends_two_percent_more_energy_is_dropped_within_100_steps():
    for seed in range(20):
        run = simulate_energy(2000, savings=[-0.02, -0.02], noise=lognormal_noise(NOISE), seed=seed)
        assert run.dropped_at is not None and run.dropped_at < 100, (seed, run)


def test_a_plan_that_saves_nothing_is_dropped():
    runs = [simulate_energy(2000, savings=[0.0, 0.0], noise=lognormal_noise(NOISE), seed=s) for s in range(10)]
    assert all(r.dropped_at is not None for r in runs), runs


@pytest.mark.parametrize("savings", [[0.10, 0.10], [0.15, 0.15], [0.20, 0.20], [0.20, -0.03]])
def test_honest_plans_are_never_dropped(savings):
    """[0.20, -0.03]: a stage slowed within its slack saves 20 % while the other waits longer and
    spends 3 % more: the job saves 8.5 % and is judged on that sum."""
    for seed in range(30):
        run = simulate_energy(2000, savings=savings, noise=lognormal_noise(NOISE), seed=1000 + seed)
        assert run.dropped_at is None, (savings, seed, run)


def test_the_job_is_judged_on_the_sum_over_its_stages():
    """Stage 1 spends 5 % more (it waits longer for a slowed stage 0), stage 0 saves 25 %: the job saves."""
    test = EnergyTest()
    ranks = [RankEnergy(75.0, 100.0, 4, 1, 0.03), RankEnergy(105.0, 100.0, 4, 1, 0.03)]
    window = job_window(ranks)
    assert window is not None and window.log_ratio == pytest.approx(math.log(0.9)) and window.ranks == 2
    for _ in range(50):
        verdict = test.observe(window)
    assert verdict is not None and verdict.statistic == 0.0 and verdict.confidence is Confidence.CONFIDENT
    assert verdict.saving == pytest.approx(0.1)
    alone = EnergyTest()  # stage 1 judged on its own would be dropped
    for _ in range(3):
        dropped = alone.observe(job_window(ranks[1:]))
    assert dropped is not None and dropped.alarm and "5.0% more energy" in dropped.reason()


def test_unmeasured_steps_are_left_out_never_counted_as_zero():
    one = rank_energy([1.0, None, 1.2, None, 1.1], [2.0, None])
    assert one is not None and (one.plan_j, one.probe_j, one.n_plan, one.n_probe) == (1.1, 2.0, 3, 1)
    assert rank_energy([None, None], [2.0]) is None and rank_energy([1.0], [None]) is None
    assert rank_energy([1.0, 0.0, 1.0], [2.0]) is None, "a 0 J read: the counter's updates are coarser than a step"
    # a window no rank measured teaches the test nothing
    test = EnergyTest()
    assert test.observe(None) is None and test.statistic == 0.0
    first = test.observe(JobWindow(math.log(1.05), 4, 1, 0.03, 1))
    again = test.observe(None)
    assert first is not None and again is not None and again.ratio is None
    assert (again.statistic, again.windows, again.saving) == (first.statistic, first.windows, first.saving)
    # one rank's steps, a third unmeasured: its window's medians come from the measured ones alone
    guard = RankGuard(ProbePlacement(seed=7))
    end = None
    for i in range(200):
        role = guard.begin_step()
        energy = None if i % 3 == 0 else (2.0 if role.default_clocks else 1.6)
        end = guard.end_step(1.0, energy) or end
        if end is not None and end.energy is not None:
            break
    assert end is not None and end.energy is not None
    assert end.energy.plan_j == 1.6 and end.energy.probe_j == 2.0
    # a synthetic run with a third of the stage-steps unmeasured: the lie is still caught, the honest plan kept
    lie = simulate_energy(2000, savings=[-0.02, -0.02], noise=lognormal_noise(NOISE), seed=3, unmeasured=0.3)
    honest = simulate_energy(2000, savings=[0.10, 0.10], noise=lognormal_noise(NOISE), seed=3, unmeasured=0.3)
    assert lie.unmeasured_steps > 0 and lie.dropped_at is not None and lie.dropped_at < 200
    assert honest.unmeasured_steps > 0 and honest.dropped_at is None


def test_energy_columns_cross_the_wire_as_floats():
    r = RankEnergy(1.5, 2.0, 5, 1, None)
    assert RankEnergy.from_row(r.row()) == r
    assert RankEnergy.from_row([math.nan] * 5) is None and RankEnergy.from_row([]) is None  # no evidence, or an older row


def test_a_score_is_bounded_so_one_outlier_window_cannot_drop_an_honest_plan():
    test = EnergyTest(EnergySettings())
    verdict = test.observe(JobWindow(math.log(3.0), 4, 1, 0.03, 2))  # a probe step 3× cheaper than usual
    assert verdict is not None and verdict.statistic == pytest.approx(2.0 - 0.25) and not verdict.alarm
    verdict = test.observe(JobWindow(math.log(3.0), 4, 1, 0.03, 2))
    assert verdict is not None and verdict.statistic == pytest.approx(2 * (2.0 - 0.25)) and not verdict.alarm


def drive(running: bool, steps: int = 300) -> list:
    """A one-rank closed loop whose plan steps spend what its probes spend; ``running`` False: the
    rank fell back for another reason before (its plan steps run default clocks)."""
    from perseus.planner.stage_plan import decode_stage, encode_stage
    from perseus.runtime.clocks.targeting import Targeting
    from perseus.runtime.guard.closed_loop import ClosedLoop
    from perseus.runtime.plane.collective import Collective

    frontier = Frontier(SCHEDULE, 80.0, 1.0, 10.0, [uniform(MAX, 0.9, 9.0), uniform(600, 1.0, 5.0)])
    plan = decode_stage(encode_stage(frontier, 0), SCHEDULE, 0)
    targeting = Targeting()
    targeting.deploy(plan)
    loop = ClosedLoop(PerseusConfig(probe_every_steps=EVERY), Collective())
    rng = np.random.default_rng(5)
    decisions = []
    for step in range(10, 10 + steps):
        loop.begin_step(step)
        decision = loop.end_step(0.01, 2.0 * rng.lognormal(0.0, 0.03), targeting, plan, running=running)
        if decision is not None:
            decisions.append(decision)
            if loop.apply(decision, targeting, speak=False) is not None:
                break
    return decisions


def test_a_rank_fallen_back_for_another_reason_gives_no_energy_evidence():
    """Its plan steps ran default clocks: judged, they would say the plan saves nothing and the run
    would blame the plan's energy for a fall-back that had another cause."""
    assert any(d.for_energy for d in drive(running=True))
    quiet = drive(running=False)
    assert quiet and not any(d.for_energy for d in quiet) and all(d.energy is None for d in quiet)


# ---------------------------------------------------------------- the runtime on a simulated GPU

def train(rt, most, t=0.003):
    """Up to ``most`` steps, stopping two steps after the guard fell back."""
    left = None
    for _ in range(most):
        rt.on_step_begin()
        for inst in rt.schedule.stages[0]:
            rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            time.sleep(t)
            rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        rt.on_step_end()
        if rt.loop.fell_back:
            left = 2 if left is None else left - 1
            if left == 0:
                return


def events(tmp_path, name):
    return [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()
            if json.loads(line).get("event") == name]


def run(tmp_path, caplog, points, steps, target_s=None, t=0.003):
    cfg = setup(tmp_path, points)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            if target_s is not None:
                rt.set_target_time(target_s)  # the time test holds the plan to this: only energy can drop it
            train(rt, steps, t)
            summary = rt.summary()
            clock = rt.gpu.current_mhz
            default = rt.gpu.default_mhz
    return summary, clock == default


def assert_dropped_for_energy(tmp_path, caplog, summary, at_default):
    said = [r.getMessage() for r in caplog.records if "energy guard" in r.getMessage()]
    assert len(said) == 1, said
    assert "does not measurably save energy" in said[0] and "95 % interval" in said[0], said[0]
    assert events(tmp_path, "guard_energy") and events(tmp_path, "guard")[-1]["data"]["action"] == "fallback"
    fallback = events(tmp_path, "fallback")
    assert fallback and "energy guard" in fallback[0]["data"]
    loop = summary["closed_loop"]
    assert summary["phase"] == "fallback" and loop["guard_fell_back"] and loop["energy"]["dropped"]
    assert loop["energy"]["statistic"] >= loop["energy"]["threshold"]
    assert "fell back: no energy saving" in summary_line(summary) and "95 % interval" in summary_line(summary)
    assert at_default, "default clocks after the fall-back"


def test_a_default_clock_plan_labelled_as_saving_falls_back_and_says_so(tmp_path, caplog):
    """The frontier's one point runs default clocks everywhere and claims half the energy: as fast
    as its probes (the time test keeps it), and it saves nothing."""
    summary, at_default = run(tmp_path, caplog, [uniform(MAX, 1.0, 5.0)], 2 + 400, t=0.006)
    assert_dropped_for_energy(tmp_path, caplog, summary, at_default)


def test_a_lying_profile_within_its_time_target_falls_back_for_energy(tmp_path, caplog):
    """The profile says 405 MHz is cheap; on this GPU it spends about a fifth more energy per step
    than default clocks. Under a time target it is within its time, so only energy can drop it."""
    summary, at_default = run(tmp_path, caplog, [uniform(MAX, 1.0, 9.0), uniform(405, 2.99, 5.0)], 2 + 120,
                              target_s=3.6)
    assert_dropped_for_energy(tmp_path, caplog, summary, at_default)
    assert "more energy" in summary_line(summary)


def test_an_honest_plan_is_kept(tmp_path, caplog):
    """1005 MHz saves about a fifth of the energy and is 1.32 times slower, within its time target."""
    summary, _ = run(tmp_path, caplog, [uniform(MAX, 1.0, 9.0), uniform(1005, 1.32, 6.0)], 2 + 100, target_s=1.6)
    loop = summary["closed_loop"]
    assert summary["phase"] == "deployed" and not loop["guard_fell_back"] and not loop["energy"]["dropped"]
    assert loop["energy"]["saving_low"] > 0.02, loop["energy"]
    assert not events(tmp_path, "guard_energy") and "energy guard" not in caplog.text
    assert "saves" in summary_line(summary)
