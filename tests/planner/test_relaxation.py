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
