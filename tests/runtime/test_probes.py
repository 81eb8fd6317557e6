"""Probe schedule: which deployed steps run at default clocks, and which steps are counted."""

import pytest

from perseus.errors import ConfigError
from perseus.runtime.guard.probes import ProbeSchedule, StepRole, clocks_label

P, PS, D, DS = StepRole.PLAN, StepRole.PLAN_SETTLE, StepRole.PROBE, StepRole.PROBE_SETTLE


def test_default_layout_matches_the_documented_table():
    sched = ProbeSchedule()
    roles = sched.roles(60)
    assert roles[:9] == [PS, P, P, P, P, DS, D, PS, P]
    assert roles[9:55] == [P] * 46
    assert roles[55:59] == [DS, D, PS, P]


def test_every_counted_sample_follows_a_step_at_its_own_clocks():
    """The unbiased A/B: no counted step is the first after a clock change (settle = 1 or 2)."""
    for settle in (1, 2):
        sched = ProbeSchedule(every=12, first=3 + settle, settle=settle)
        roles = [StepRole.PROBE] * settle + sched.roles(200)  # planning ran at default clocks before step 0
        for i in range(settle, len(roles)):
            if roles[i].counted:
                before = roles[i - settle:i]
                assert all(r.default_clocks == roles[i].default_clocks for r in before), (settle, i, roles[i - 3:i + 1])


def test_probe_blocks_are_never_adjacent_and_plan_steps_are_counted_between():
    sched = ProbeSchedule(every=ProbeSchedule.min_every(1), first=1, settle=1)
    roles = sched.roles(100)
    probes = [i for i, r in enumerate(roles) if r is D]
    assert probes and all(b - a == sched.every for a, b in zip(probes, probes[1:]))
    for a, b in zip(probes, probes[1:]):
        assert P in roles[a + 1:b]


def test_default_fraction_is_the_probes_cost_share():
    sched = ProbeSchedule(every=50)
    roles = sched.roles(5000 + sched.first)
    share = sum(r.default_clocks for r in roles[sched.first:]) / 5000
    assert share == pytest.approx(sched.default_fraction) and sched.default_fraction == pytest.approx(0.04)


def test_off_means_only_plan_steps():
    roles = ProbeSchedule(every=0).roles(300)
    assert roles[0] is PS and set(roles[1:]) == {P}
    assert ProbeSchedule(every=0).default_fraction == 0.0


def test_clocks_label_marks_default_clock_steps():
    assert [clocks_label(r) for r in (P, PS, D, DS)] == ["plan", "plan", "default", "default"]


@pytest.mark.parametrize("kwargs, words", [
    ({"every": 3}, "probe_every_steps=3"),
    ({"every": -1}, ">= 0"),
    ({"settle": -1}, "settle"),
    ({"first": 0, "settle": 1}, "first probe"),
])
def test_bad_settings_are_one_line_config_errors(kwargs, words):
    with pytest.raises(ConfigError, match=words) as err:
        ProbeSchedule(**kwargs)
    assert "\n" not in str(err.value)


def test_negative_step_is_a_caller_bug():
    with pytest.raises(ValueError):
        ProbeSchedule().role(-1)
