"""The end-to-end tests' guard checker (tests/guard_checks.py), on synthetic metrics files.

A good run's file is written by the real ``TimeGuard`` fed the synthetic step times (its events
are what the runtime would have written); a bad one is that file with the guard's decisions
tampered with. The checker must pass the first and fail the second, loudly.
"""

from __future__ import annotations

import pytest

from guard_checks import check_guard_run, split_run
from perseus.runtime.guard.probes import ProbeSchedule
from perseus.runtime.guard.time_guard import GuardSettings, TimeGuard

SETTINGS = GuardSettings()
EVERY = 6
FIRST = 4  # steps 0..3 are warm-up/profiling/planning; step 4 is deployed step 0


def synthetic_run(plan_s: list[float], probe_s: float = 1.0, steps: int = 40, run_id: str = "r1",
                  fallback_event: bool = True, act: bool = True) -> list[dict]:
    """A metrics file of one run: ``FIRST`` steps before deployment, then ``steps`` deployed steps;
    plan steps take ``plan_s[k]`` at the k-th point (moves follow the guard's FASTER decisions).
    ``act=False``: a broken runtime that records every decision as "keep" and never acts."""
    schedule, guard = ProbeSchedule(every=EVERY), TimeGuard(SETTINGS)
    lines: list[dict] = [{"run_id": run_id, "step": s, "phase": "warmup", "time_s": probe_s} for s in range(FIRST)]
    point, phase = 0, "deployed"
    for i in range(steps):
        step, role = FIRST + i, schedule.role(i)
        time_s = probe_s * (1 + 0.002 * ((i * 7) % 5 - 2))  # small, deterministic noise
        if not role.default_clocks and phase == "deployed":
            time_s *= plan_s[min(point, len(plan_s) - 1)]
        row = {"run_id": run_id, "step": step, "phase": phase, "time_s": time_s}
        if phase == "deployed":
            row["clocks"] = "default" if role.default_clocks else "plan"
        lines.append(row)
        if phase != "deployed":
            continue
        decision = guard.observe(role, time_s, at_fastest=point >= len(plan_s) - 1)
        if decision is None:
            continue
        data = decision.as_dict()
        if not act and data["action"] != "keep":
            data.update(action="keep", reason="kept")
            guard = TimeGuard(SETTINGS)
        lines.append({"run_id": run_id, "event": "guard", "step": step, "data": data})
        if not act:
            continue
        if decision.action.value == "faster":
            point += 1
        elif decision.action.value == "fallback":
            phase = "fallback"
            if fallback_event:
                lines.append({"run_id": run_id, "event": "fallback", "step": step,
                              "data": f"no-slowdown guard: {decision.reason}"})
    return lines


def check(lines: list[dict]):
    steps, events = split_run(lines)
    return check_guard_run(steps, events, SETTINGS, EVERY)


def test_a_plan_as_fast_as_default_clocks_holds():
    verdict = check(synthetic_run([1.0]))
    assert verdict.outcome == "within" and verdict.moves == 0 and not verdict.fell_back
    assert verdict.checks >= SETTINGS.patience and verdict.first_deployed_step == FIRST
    assert abs(verdict.final.excess) < 0.01


def test_a_slow_plan_moved_to_a_faster_point_that_holds_passes():
    verdict = check(synthetic_run([1.10, 1.0], steps=60))
    assert verdict.moves == 1 and verdict.outcome == "within", verdict.describe()


def test_a_plan_slow_even_at_the_fastest_point_falls_back_and_says_why():
    verdict = check(synthetic_run([1.10]))
    assert verdict.fell_back and verdict.outcome == "fell back", verdict.describe()


def test_a_run_that_stays_slow_without_acting_fails_with_the_numbers():
    with pytest.raises(AssertionError, match=r"3 slow checks in a row .* kept the plan: excess \+0\.\d+ > margin"):
        check(synthetic_run([1.10], act=False))


def test_a_slow_end_that_the_guard_never_called_slow_in_a_row_fails():
    """The plan ran 10 % slower all along, but the guard's checks alternate slow and within (never
    ``patience`` in a row, so its actions follow its evidence): the end state, recomputed from the
    step lines, catches a plan that stays deployed while measurably slower."""
    lines = synthetic_run([1.10], steps=40, act=False)
    checks = [line["data"] for line in lines if line.get("event") == "guard" and line["data"]["excess"] is not None]
    assert len(checks) >= 5
    for k, data in enumerate(checks):
        data.update(excess=0.05 if k % 2 == 0 else 0.0, margin=0.02)
    with pytest.raises(AssertionError, match=r"ended deployed and measurably slower: final point: median of \d+ plan"):
        check(lines)


def test_a_slow_end_while_the_guard_collects_evidence_passes():
    """Slow at the end, but fewer than ``patience`` slow checks so far: the guard may not act yet."""
    lines = synthetic_run([1.10], steps=26, act=False)
    checks = [line["data"] for line in lines if line.get("event") == "guard" and line["data"]["excess"] is not None]
    assert len(checks) == 4
    for k, data in enumerate(checks):  # within, within, slow, slow
        data.update(excess=0.0 if k < 2 else 0.05, margin=0.02)
    verdict = check(lines)
    assert verdict.outcome == "collecting" and verdict.final.excess > verdict.final.margin, verdict.describe()


def test_a_fallback_without_its_event_fails():
    with pytest.raises(AssertionError, match="no fallback event"):
        check(synthetic_run([1.10], fallback_event=False))


def test_a_move_without_evidence_fails():
    lines = synthetic_run([1.0])
    first_check = next(line for line in lines if line.get("event") == "guard" and line["data"]["excess"] is not None)
    first_check["data"]["action"] = "faster"
    with pytest.raises(AssertionError, match="decided 'faster' after 0 slow check"):
        check(lines)


def test_probe_steps_must_be_marked_in_the_file():
    lines = synthetic_run([1.0])
    next(line for line in lines if line.get("clocks") == "default")["clocks"] = "plan"
    with pytest.raises(AssertionError, match="marked clocks='plan'"):
        check(lines)


def test_too_few_checks_fail():
    with pytest.raises(AssertionError, match="guard check.* with samples"):
        check(synthetic_run([1.0], steps=12))


def test_an_appended_file_needs_a_run_named():
    with pytest.raises(AssertionError, match="holds 2 runs"):
        split_run(synthetic_run([1.0]) + synthetic_run([1.0], run_id="r2"))
    steps, _ = split_run(synthetic_run([1.0]) + synthetic_run([1.0], run_id="r2"), run_id="r2")
    assert {r["run_id"] for r in steps} == {"r2"}
