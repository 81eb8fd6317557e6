"""The LP's deadline slope gives valid tangent lower bounds (used to pick plans to improve)."""

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.choices import build_node_choices
from perseus.planner.relaxation import HullRelaxation
from perseus.schedules import build_schedule
from perseus.timeline.simulator import longest_path_finish
from synthetic import synthetic_profile


def test_deadline_slope_is_a_tangent_below_the_lp_value():
    dag = InstructionDAG.from_schedule(build_schedule("1f1b", 3, 4))
    profile = synthetic_profile(3, 20, seed=2)
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    lp = HullRelaxation(dag, node_choices)
    fastest = longest_path_finish(dag, node_choices.fastest_times()).max()
    grid = fastest * np.linspace(1.02, 1.4, 9)
    values, slopes = [], []
    for deadline in grid:
        values.append(lp.solve(deadline)[1])
        slopes.append(lp.deadline_slope())
    assert min(slopes) < 0  # tighter deadlines cost more
    for i, (v, s) in enumerate(zip(values, slopes)):
        tangent = v + s * (grid - grid[i])
        assert np.all(tangent <= np.array(values) + 1e-9 * abs(v))


def test_a_warm_start_that_ends_in_numerical_trouble_is_solved_again_from_scratch():
    """The torch demo's profile (torch-interleaved, 2 stages x 2 chunks, 4 microbatches; nominal
    times, so every key's times are exact multiples of the others') once made the warm-started
    dual simplex end with status "Unknown" at one deadline, and planning failed: the run stayed at
    default clocks. The same deadline solved from scratch is optimal."""
    from perseus.planner import plan_frontier
    from perseus.profile import InstructionProfile, Profile

    freqs = (1410, 1155, 900)
    t0 = {"forward": (0.00999999999839929, 0.011766233765229117, 0.014533333334838971),
          "backward": (0.020000000000436557, 0.023532467534096213, 0.029066666666039964)}
    t1 = {"forward": (0.01299999999901047, 0.015296103894797852, 0.01889333333383547),
          "backward": (0.02600000000165892, 0.030592207793233683, 0.03778666666767094)}
    energies = {  # as measured, to the last digit: the trouble needs these
        (0, 0, "forward"): (3.89999999937571, 3.0521536779337293, 2.9451896660504127),
        (0, 0, "backward"): (7.800000000170262, 6.1043073568111295, 5.890379331363396),
        (0, 1, "forward"): (3.8999999993757086, 3.0521536779336986, 2.9451896660503527),
        (0, 1, "backward"): (7.80000000017024, 6.104307356811066, 5.8903793313634845),
        (1, 0, "forward"): (5.069999999614089, 3.9677997813137944, 3.8287465655706194),
        (1, 0, "backward"): (10.140000000646983, 7.935599563571348, 7.657493131141025),
        (1, 1, "forward"): (5.069999999614102, 3.9677997813138237, 3.828746565570534),
        (1, 1, "backward"): (10.140000000646987, 7.93559956357129, 7.657493131141085),
    }
    entries = {(stage, chunk, kind): InstructionProfile(freqs, (t0 if stage == 0 else t1)[kind], e)
               for (stage, chunk, kind), e in energies.items()}
    profile = Profile(entries, 83.64, "NVIDIA A100-SXM4-40GB (simulated)")
    frontier = plan_frontier(build_schedule("torch-interleaved", 2, 4, 2), profile)
    assert len(frontier.points) > 1 and frontier.points[-1].energy_j < frontier.points[0].energy_j
