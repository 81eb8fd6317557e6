"""The end-to-end tests' guard checker (tests/guard_checks.py), on synthetic metrics files.

A good run's file is written by the real ``RankGuard`` and ``agree`` fed the synthetic step times
(its events are what the runtime would have written); a bad one is that file with the guard's
decisions tampered with. The checker must pass the first and fail the second, loudly.
"""

from __future__ import annotations

import random

import pytest
from guard_checks import check_guard_run, split_run

from perseus.runtime.guard.job_guard import Action, RankGuard, agree, verdict_row
from perseus.runtime.guard.placement import ProbePlacement
from perseus.runtime.guard.sequential import SequentialSettings

SETTINGS = SequentialSettings()
FIRST = 4  # steps 0..3 are warm-up/profiling/planning; step 4 is deployed step 0


def synthetic_run(plan_s: list[float], probe_s: float = 1.0, steps: int = 120, run_id: str = "r1",
                  fallback_event: bool = True, act: bool = True, seed: int = 3) -> list[dict]:
    """A metrics file of one run: ``FIRST`` steps before deployment, then ``steps`` deployed steps;
    plan steps take ``plan_s[k]`` × the probe's time at the k-th point (moves follow FASTER
    decisions). ``act=False``: a broken runtime that records every decision as "keep"."""
    rng = random.Random(seed)
    guard = RankGuard(ProbePlacement(seed=seed), SETTINGS)
    lines: list[dict] = [{"run_id": run_id, "step": s, "phase": "warmup", "time_s": probe_s} for s in range(FIRST)]
    point, phase = 0, "deployed"
    for i in range(steps):
        step = FIRST + i
        role = guard.begin_step() if phase == "deployed" else None
        time_s = probe_s * rng.lognormvariate(0.0, 0.01)
        if role is not None and not role.default_clocks:
            time_s *= plan_s[min(point, len(plan_s) - 1)]
        row = {"run_id": run_id, "step": step, "phase": phase, "time_s": time_s}
        if role is not None:
            row["clocks"] = "default" if role.default_clocks else "plan"
        lines.append(row)
        if role is None:
            continue
        end = guard.end_step(time_s, 1.0)
        if end is None:
            continue
        decision = agree([verdict_row(0, end.verdict)], end.length, SETTINGS, at_fastest=point >= len(plan_s) - 1)
        guard.apply(decision)
        data = {"action": decision.action.value, "reason": decision.reason, "threshold": SETTINGS.threshold,
                "slow_pipelines": list(decision.slow_pipelines),
                "pipelines": {"0": {"statistic": guard.test.statistic if decision.action is Action.KEEP
                                    else decision.statistic.get(0, 0.0), "probe_share": guard.cost.share}}}
        if not act and decision.action is not Action.KEEP:
            data.update(action="keep", reason="kept", slow_pipelines=[])
        lines.append({"run_id": run_id, "event": "guard", "step": step, "data": data})
        if not act:
            continue
        if decision.action is Action.FASTER:
            point += 1
        elif decision.action is Action.FALLBACK:
            phase = "fallback"
            if fallback_event:
                lines.append({"run_id": run_id, "event": "fallback", "step": step,
                              "data": f"no-slowdown guard: {decision.reason}"})
    return lines


def check(lines: list[dict]):
    steps, events = split_run(lines)
    return check_guard_run(steps, events, SETTINGS.threshold)


def test_a_plan_as_fast_as_default_clocks_is_kept():
    verdict = check(synthetic_run([1.0]))
    assert verdict.outcome == "kept" and verdict.moves == 0 and not verdict.fell_back
    assert verdict.windows >= 5 and verdict.first_deployed_step == FIRST
    assert verdict.statistic["0"] < SETTINGS.threshold


def test_a_slow_plan_moved_to_a_faster_point_passes():
    verdict = check(synthetic_run([1.30, 1.0], steps=200))
    assert verdict.moves == 1 and not verdict.fell_back, verdict.describe()


def test_a_plan_slow_even_at_the_fastest_point_falls_back_and_says_why():
    verdict = check(synthetic_run([1.30]))
    assert verdict.fell_back and verdict.outcome == "fell back", verdict.describe()


def test_a_run_that_stays_slow_without_acting_fails_with_the_numbers():
    with pytest.raises(AssertionError, match=r"reached the threshold 5.0 and the job decided 'keep'"):
        check(synthetic_run([1.30], act=False))


def test_a_fallback_without_its_event_fails():
    with pytest.raises(AssertionError, match="no fallback event"):
        check(synthetic_run([1.30], fallback_event=False))


def test_a_move_without_evidence_fails():
    lines = synthetic_run([1.0])
    next(line for line in lines if line.get("event") == "guard")["data"]["action"] = "faster"
    with pytest.raises(AssertionError, match="'faster' with every statistic below the threshold"):
        check(lines)


def test_a_window_without_a_probe_block_fails():
    lines = synthetic_run([1.0])
    for line in lines:
        if line.get("clocks") == "default" and line["step"] < next(e["step"] for e in lines if e.get("event")):
            line["clocks"] = "plan"
    with pytest.raises(AssertionError, match="ran no probe block"):
        check(lines)


def test_no_window_at_all_fails():
    with pytest.raises(AssertionError, match="no probe window ended"):
        check(synthetic_run([1.0], steps=5))


def test_an_appended_file_needs_a_run_named():
    with pytest.raises(AssertionError, match="holds 2 runs"):
        split_run(synthetic_run([1.0]) + synthetic_run([1.0], run_id="r2"))
    steps, _ = split_run(synthetic_run([1.0]) + synthetic_run([1.0], run_id="r2"), run_id="r2")
    assert {r["run_id"] for r in steps} == {"r2"}


def energy_fallback(lines: list[dict], statistic: float) -> list[dict]:
    """A kept run whose third window's job energy statistic reads ``statistic`` and which fell back
    there for energy, as the runtime writes it."""
    at = [line for line in lines if line.get("event") == "guard"][2]
    at["data"].update(action="fallback", reason="the plan does not measurably save energy",
                      energy={"statistic": statistic, "threshold": SETTINGS.threshold})
    kept = [line for line in lines if line["step"] <= at["step"] + 1 and line is not at]
    for line in kept:
        if line["step"] == at["step"] + 1 and "event" not in line:
            line["phase"] = "fallback"
            line.pop("clocks", None)
    return kept + [at, {"run_id": "r1", "event": "fallback", "step": at["step"],
                        "data": "energy guard: the plan does not measurably save energy"}]


def test_a_fallback_for_energy_passes_when_the_energy_statistic_reached_its_threshold():
    verdict = check(energy_fallback(synthetic_run([1.0]), 5.5))
    assert verdict.fell_back and verdict.outcome == "fell back", verdict.describe()


def test_a_fallback_for_energy_without_its_evidence_fails():
    with pytest.raises(AssertionError, match="'fallback' with every statistic below the threshold"):
        check(energy_fallback(synthetic_run([1.0]), 1.0))
