"""Every pipeline's evidence, one job decision: ranks' verdicts gathered, the same decision on each."""

import random

import pytest

from perseus.runtime.guard.job_guard import (
    Action,
    RankGuard,
    agree,
    judging_stages,
    target_ratio,
    verdict_of,
    verdict_row,
)
from perseus.runtime.guard.placement import ProbePlacement, probe_seed
from perseus.runtime.guard.sequential import (
    Confidence,
    SequentialSettings,
    WindowVerdict,
)
from perseus.runtime.guard.simulation import HostEvent


def test_verdicts_cross_the_wire_as_floats():
    v = WindowVerdict(1.2, 3.4, Confidence.ALARM, 1.08, 0.07, None)
    dp, back = verdict_of(verdict_row(3, v))
    assert dp == 3 and back is not None
    assert (back.score, back.statistic, back.confidence, back.ratio, back.excess) == (1.2, 3.4, Confidence.ALARM, 1.08, 0.07)
    assert verdict_of(verdict_row(1, None)) == (1, None)


def row(dp: int, confidence: Confidence, statistic: float = 0.0, excess: float | None = None) -> list[float]:
    return verdict_row(dp, WindowVerdict(0.0, statistic, confidence, 1.0, excess, None))


def test_the_job_moves_by_the_slowest_alarming_pipeline():
    s = SequentialSettings()
    rows = [row(0, Confidence.CONFIDENT), row(0, Confidence.UNSURE, 1.0),
            row(1, Confidence.ALARM, 7.5, 0.04), row(2, Confidence.ALARM, 8.0, 0.09)]
    d = agree(rows, 32, s, at_fastest=False)
    assert d.action is Action.FASTER and d.factor == pytest.approx(1 / 1.09)
    assert d.slow_pipelines == (1, 2) and d.next_length == s.backoff.first and d.statistic[0] == 1.0
    assert "pipeline 2 +9.0%" in d.reason
    assert agree(rows, 32, s, at_fastest=True).action is Action.FALLBACK


def test_within_everywhere_keeps_and_the_least_confident_sets_the_length():
    s = SequentialSettings()
    d = agree([row(0, Confidence.CONFIDENT), row(1, Confidence.CONFIDENT)], 32, s, at_fastest=False)
    assert d.action is Action.KEEP and d.next_length == 64
    d = agree([row(0, Confidence.CONFIDENT), row(1, Confidence.SUSPECT, 4.0)], 32, s, at_fastest=False)
    assert d.action is Action.KEEP and d.next_length == s.backoff.first


def test_only_the_stages_that_begin_or_end_the_iteration_judge_their_pipeline():
    """A later 1F1B stage slowed within its slack sees its own span grow (the unpadded DeepSpeed
    script's second stage: 10-15 %) while the iteration does not: its alarm does not vote. Stage 0's
    does. The zero-bubble schedules end on weight gradients of every stage: every stage judges."""
    from perseus.schedules.registry import build_schedule

    assert judging_stages(build_schedule("1f1b", 4, 8)) == {0}
    assert judging_stages(build_schedule("interleaved", 4, 8, 2)) == {0}
    assert judging_stages(build_schedule("gpipe", 3, 6)) == {0}
    assert judging_stages(build_schedule("zbv", 4, 8, 2)) == {0, 1, 2, 3}
    s = SequentialSettings()
    rows = [row(0, Confidence.CONFIDENT), row(0, Confidence.ALARM, 5.7, 0.11)]  # stage 0, stage 1 of pipeline 0
    d = agree(rows, 6, s, at_fastest=True, judges=[True, False])
    assert d.action is Action.KEEP and d.statistic == {0: 0.0}
    assert d.next_length == s.backoff.grow(6)  # the judging rank's confidence sets the length
    assert agree(rows, 6, s, at_fastest=True, judges=[True, True]).action is Action.FALLBACK
    assert agree(rows[::-1], 6, s, at_fastest=True, judges=[True, False]).action is Action.FALLBACK


def run_job(slowdowns: dict[int, float], steps: int, *, period: int = 4, seed: int = 0) -> list[tuple[int, object]]:
    """Pipelines × 2 stages, each rank its own noise, every rank the same seeded placement."""
    rng = random.Random(seed)
    placement = ProbePlacement(seed=probe_seed(37, "fp"))
    ranks = {(dp, st): RankGuard(placement) for dp in slowdowns for st in range(2)}
    event = HostEvent(period, 0.3)
    scale = {dp: 1.0 for dp in slowdowns}  # the job's move speeds every pipeline up
    decisions = []
    for step in range(steps):
        ends = {}
        for (dp, _), guard in ranks.items():
            role = guard.begin_step()
            t = rng.lognormvariate(0, 0.02) * (1 + event.extra(step))
            if not role.default_clocks:
                t *= max(1.0, (1 + slowdowns[dp]) * scale[dp])
            ends[(dp, _)] = guard.end_step(t, 100.0 if role.default_clocks else 80.0)
        if any(e is not None for e in ends.values()):
            assert all(e is not None for e in ends.values())  # every rank closes windows together
            rows = [verdict_row(dp, e.verdict) for (dp, _), e in ends.items()]  # type: ignore[union-attr]  # all not None: asserted above
            length = next(iter(ends.values())).length  # type: ignore[union-attr]  # all not None: asserted above
            d = agree(rows, length, SequentialSettings(), at_fastest=False)
            for guard in ranks.values():
                guard.apply(d)
            if d.action is not Action.KEEP:
                decisions.append((step, d))
                for dp in scale:
                    scale[dp] *= d.factor
    return decisions


def test_one_slow_pipeline_moves_the_job():
    decisions = run_job({0: 0.0, 1: 0.10}, 600)
    assert decisions and decisions[0][1].slow_pipelines == (1,)  # type: ignore[attr-defined]  # run_job types its decisions as object


def test_honest_pipelines_are_left_alone():
    assert run_job({0: 0.0, 1: 0.0}, 3000, seed=1) == []


def test_probe_cost_counts_default_steps_and_their_extra_energy():
    guard = RankGuard(ProbePlacement(seed=1))
    for _ in range(400):
        role = guard.begin_step()
        end = guard.end_step(1.0, 100.0 if role.default_clocks else 80.0)
        if end is not None:
            guard.apply(agree([verdict_row(0, end.verdict)], end.length, guard.settings, at_fastest=False))
    cost = guard.cost
    assert cost.deployed_steps == 400 and 0 < cost.share < 0.3
    assert cost.extra_energy_j == pytest.approx(20.0 * cost.default_steps, rel=0.2)
    assert guard.summary()["probe_share"] == cost.share


def test_a_target_is_held_in_units_of_the_probes_reference_never_faster_than_it():
    assert target_ratio(None, 2.0) == 1.0
    assert target_ratio(2.4, 2.0) == pytest.approx(1.2)
    assert target_ratio(1.5, 2.0) == 1.0
    with pytest.raises(ValueError, match="positive"):
        target_ratio(1.0, 0.0)
