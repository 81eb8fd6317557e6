import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.errors import PerseusError, ProfileError
from perseus.planner import PlannerOptions, plan_frontier
from perseus.profile import InstructionProfile, Profile, uniform_profile
from perseus.schedules import build_schedule
from perseus.timeline.simulator import max_frequency_plan, simulate_plan
from synthetic import synthetic_profile


@pytest.fixture(scope="module")
def solved():
    schedule = build_schedule("1f1b", 4, 6)
    profile = synthetic_profile(4, 24, seed=3)
    return schedule, profile, plan_frontier(schedule, profile)


def test_every_point_is_its_plan_simulated_on_measured_values(solved):
    schedule, profile, frontier = solved
    dag = InstructionDAG.from_schedule(schedule)
    assert len(frontier.points) > 20
    for point in frontier.points:
        timeline = simulate_plan(dag, profile, point.freqs_mhz)
        assert point.time_s == timeline.time_s
        assert point.energy_j == timeline.energy_j


def test_frontier_is_strictly_pareto(solved):
    _, _, frontier = solved
    times = np.array([p.time_s for p in frontier.points])
    energies = np.array([p.energy_j for p in frontier.points])
    assert np.all(np.diff(times) > 0)
    assert np.all(np.diff(energies) < 0)


def test_no_slowdown_and_savings_at_the_all_max_time(solved):
    schedule, profile, frontier = solved
    dag = InstructionDAG.from_schedule(schedule)
    base = simulate_plan(dag, profile, max_frequency_plan(dag, profile))
    assert frontier.fastest.time_s <= base.time_s
    assert frontier.baseline_time_s == base.time_s
    default = frontier.default_point()
    assert default.time_s <= base.time_s
    assert default.energy_j < 0.97 * base.energy_j  # slack of non-critical work is reclaimed


def test_fastest_plan_uses_a_lower_clock_when_it_is_measured_faster():
    # 1300 MHz measured faster than 1400 MHz: the planner must not be slower than all-max.
    fwd = InstructionProfile((1400, 1300, 1000), (1.0, 0.99, 1.4), (100.0, 98.0, 80.0))
    bwd = InstructionProfile((1400, 1300, 1000), (2.0, 1.98, 2.8), (200.0, 196.0, 160.0))
    schedule = build_schedule("1f1b", 2, 3)
    profile = uniform_profile(2, {"forward": fwd, "backward": bwd}, p_blocking_w=20.0)
    frontier = plan_frontier(schedule, profile)
    assert frontier.fastest.time_s < frontier.baseline_time_s


def test_progress_reports_increasing_fractions_up_to_one():
    seen: list[float] = []
    plan_frontier(build_schedule("1f1b", 2, 3), synthetic_profile(2, 10, seed=0), progress=seen.append)
    assert len(seen) > 3
    assert seen == sorted(seen) and 0 <= seen[0] and seen[-1] == 1.0


def test_interleaved_schedule_is_planned():
    schedule = build_schedule("interleaved", 2, 4, 2)
    profile = synthetic_profile(2, 12, seed=5, num_chunks=2)
    frontier = plan_frontier(schedule, profile)
    assert frontier.fastest.time_s <= frontier.baseline_time_s
    assert frontier.default_point().energy_j < frontier.baseline_energy_j


def test_single_option_profile_gives_the_all_max_plan():
    one = InstructionProfile((1400,), (1.0,), (100.0,))
    schedule = build_schedule("1f1b", 2, 2)
    frontier = plan_frontier(schedule, uniform_profile(2, {"forward": one, "backward": one}, 50.0))
    assert len(frontier.points) == 1
    assert frontier.fastest.energy_j == frontier.baseline_energy_j


def test_bad_options_and_missing_p_blocking_are_clear_errors():
    schedule = build_schedule("1f1b", 2, 2)
    profile = synthetic_profile(2, 8, seed=0)
    with pytest.raises(PerseusError, match="num_deadlines"):
        PlannerOptions(num_deadlines=0)
    with pytest.raises(PerseusError, match="improve_time_s"):
        PlannerOptions(improve_time_s=-1)
    with pytest.raises(PerseusError, match="beam_max_width"):
        PlannerOptions(beam_width=1000, beam_max_width=500)
    no_pb = Profile(dict(profile.entries), None)
    with pytest.raises(ProfileError, match="P_blocking"):
        plan_frontier(schedule, no_pb)
    with pytest.raises(ProfileError, match="stages"):
        plan_frontier(build_schedule("1f1b", 3, 2), profile)


def test_paced_lookup_is_the_least_energy_when_stretched(solved):
    schedule, profile, frontier = solved
    plans = frontier.points + frontier.paced_points
    assert frontier.paced_points, "a wait at blocking power makes some slower plans worth keeping"
    dag = InstructionDAG.from_schedule(schedule)
    for point in frontier.paced_points:  # simulated like every point
        assert simulate_plan(dag, profile, point.freqs_mhz).energy_j == point.energy_j
    for target in np.linspace(frontier.fastest.time_s, 1.3 * frontier.slowest.time_s, 25):
        chosen = frontier.paced_lookup(target)
        assert chosen.time_s <= target * (1 + 1e-12)
        fitting = [p for p in plans if p.time_s <= target * (1 + 1e-12)]
        assert frontier.paced_energy_j(chosen, target) <= min(frontier.paced_energy_j(p, target) for p in fitting) + 1e-9


def test_planner_options_from_a_mapping_name_unknown_keys_and_land_in_the_metadata():
    options = PlannerOptions.from_mapping({"num_anchors": 8, "num_deadlines": 64, "beam_width": 0})
    assert options == PlannerOptions(num_anchors=8, num_deadlines=64, beam_width=0)
    with pytest.raises(PerseusError, match="unknown planner option.*num_anchor\\b.*valid options are num_anchors"):
        PlannerOptions.from_mapping({"num_anchor": 8})
    with pytest.raises(PerseusError, match="max_window must be an integer >= 1"):
        PlannerOptions(max_window=True)
    with pytest.raises(PerseusError, match="PlannerOptions"):
        plan_frontier(build_schedule("1f1b", 2, 2), synthetic_profile(2, 8, seed=0), {"num_anchors": 8})
    frontier = plan_frontier(build_schedule("1f1b", 2, 2), synthetic_profile(2, 8, seed=0), options)
    assert {k: frontier.metadata[k] for k in PlannerOptions.names()} == options.as_dict()
    assert frontier.metadata["planner"] == "hull-lp+repair"
