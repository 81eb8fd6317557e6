"""What a torch demo run must show, checked on what does not depend on how busy the machine is.

The same checks as ``tests/demo_checks.py`` on the integration branch (this branch predates it;
once both land, ``check_deployed_demo`` there can replace this file): the no-slowdown plan was
deployed on every rank without fallback, every deployed iteration executed the plan's
instructions in order (so the reported order matched the schedule data), the simulated GPUs ran
at the planned clocks, and on the simulated GPU's own DVFS model (the truth the measured profile
approximates) the plan uses less energy than all-max clocks and is no slower than the profile's
errors allow. Wall-clock time and the energy counter are not asserted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perseus.dag import InstructionDAG
from perseus.frontier import Frontier, load_frontier
from perseus.gpu.sim.dvfs import get_preset
from perseus.profile import InstructionProfile, Profile, load_json
from perseus.simulator import max_frequency_plan, simulate_plan

APPLIED_SHARE = 0.75  # the clock switch is asynchronous: a late one can miss a short instruction
MIN_SAVING = 0.03


def true_profile(cfg: Any, measured: Profile) -> Profile:
    """Every measured (stage, chunk, kind) at every clock of the simulated GPU, from its DVFS model."""
    model = get_preset(cfg.sim_gpu["preset"])
    clocks = model.supported_sm_clocks()
    entries = {}
    for stage, chunk, kind in measured.entries:
        nominal = cfg.nominal_s(stage)[kind]
        runs = [model.throttled_clock(f, 1.0, model.tdp_w) for f in clocks]
        entries[(stage, chunk, kind)] = InstructionProfile(
            tuple(clocks), tuple(model.kernel_time_s(nominal, f) for f in runs),
            tuple(model.kernel_energy_j(nominal, f) for f in runs))
    return Profile(entries, model.p_blocking_w, model.name)


def cached(cache_dir: Path) -> tuple[Frontier, Profile]:
    found = sorted(Path(cache_dir).glob("*/frontier.json"))
    assert len(found) == 1, f"expected one cached frontier in {cache_dir}, found {found}"
    return load_frontier(found[0]), load_json(found[0].with_name("profile.json"))


@dataclass
class Accounting:
    plan_time_s: float
    plan_energy_j: float
    max_time_s: float
    max_energy_j: float
    applied_share: float
    slowdown_bound: float

    @property
    def saving(self) -> float:
        return 1.0 - self.plan_energy_j / self.max_energy_j

    @property
    def slowdown(self) -> float:
        return self.plan_time_s / self.max_time_s - 1.0

    def __str__(self) -> str:
        return (f"true model: plan {self.plan_time_s * 1e3:.2f} ms {self.plan_energy_j:.2f} J vs all-max "
                f"{self.max_time_s * 1e3:.2f} ms {self.max_energy_j:.2f} J (saving {100 * self.saving:.1f} %, "
                f"time {100 * self.slowdown:+.2f} %, profile errors allow {100 * self.slowdown_bound:+.2f} %); "
                f"clocks applied as planned: {100 * self.applied_share:.1f} %")


def check_deployed_demo(results: list[dict[str, Any]], cfg: Any, cache_dir: Path) -> Accounting:
    frontier, measured = cached(cache_dir)
    point = frontier.default_point()
    for result in results:
        summary = result["summary"]
        assert summary["phase"] == "deployed" and summary["fallback"] is None, summary
        assert np.isclose(summary["point"]["time_s"], point.time_s) and np.isclose(summary["point"]["energy_j"], point.energy_j)
    deployed = [rec["step"] for rec in results[0]["steps"] if rec["phase"] == "deployed"]
    assert len(deployed) == cfg.deployed_steps
    hits = total = 0
    for result in results:
        plan = frontier.stage_plan(point, result["stage"])
        want = [[inst.kind, inst.microbatch, inst.chunk] for inst, _ in plan]
        by_step = {rec["step"]: rec for rec in result["steps"]}
        for step in deployed:
            executed = by_step[step]["instructions"]
            assert [i[:3] for i in executed] == want, f"rank {result['rank']} step {step}: executed order differs"
            hits += sum(i[3] == f for i, (_, f) in zip(executed, plan))
            total += len(plan)
    truth = true_profile(cfg, measured)
    dag = InstructionDAG.from_schedule(frontier.schedule)
    plan_sim = simulate_plan(dag, truth, point.freqs_mhz)
    base = simulate_plan(dag, truth, max_frequency_plan(dag, truth))
    ratios = [truth.get(s, k, c).at(f)[0] / t for (s, c, k), e in measured.entries.items()
              for f, t in zip(e.freqs_mhz, e.times_s)]
    acc = Accounting(plan_sim.time_s, plan_sim.energy_j, base.time_s, base.energy_j, hits / total,
                     max(ratios) / min(ratios) - 1.0)
    assert acc.applied_share >= APPLIED_SHARE, str(acc)
    assert acc.saving >= MIN_SAVING, str(acc)
    assert acc.slowdown <= acc.slowdown_bound + 1e-9, str(acc)
    return acc
