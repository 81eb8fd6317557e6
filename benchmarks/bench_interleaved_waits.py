"""How much slower megatron-core runs an interleaved plan than planned, by the DAG it was planned on.

The planner trusts its DAG: slack the DAG shows but megatron does not have is spent on lower
clocks, and the plan runs slower than planned. This plans the same job on three DAGs and
simulates every frontier point under megatron's full waits, as derived independently by
``tests/megatron/megatron_p2p_model.py`` (FIFO matching of megatron-core 0.19's exchanges):

- ``data flow``: cross-stage data flow only;
- ``v4``: data flow + joint receives (``DAG_MODEL_VERSION`` 4, before perseus/schedules/exchanges.py);
- ``current``: ``dependencies(Schedule)`` as shipped.

Columns: the no-slowdown point's time under megatron's waits against the all-max plan's time
under the same waits, and the worst frontier point's time under those waits against the time it
was planned for. Profile: the shipped example (4 stages), each stage split evenly into 2 chunks.

    PYTHONPATH=$PWD python benchmarks/bench_interleaved_waits.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from perseus.schedules.dag import InstructionDAG
from perseus.examples import load_example_profile
from perseus.planner import plan_frontier
from perseus.profile import split_into_chunks
from perseus.schedules import Schedule, build_schedule
from perseus.timeline.simulator import max_frequency_plan, simulate_plan
from perseus.schedules import dependencies

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "megatron"))
from megatron_p2p_model import megatron_waits

Edge = tuple[tuple[int, int], tuple[int, int]]
CASES = [(8, 4), (8, 8), (12, 6), (16, 8)]  # (microbatches, microbatch group size)


@dataclasses.dataclass(frozen=True)
class FixedEdges(Schedule):
    """A schedule whose DAG is given edges instead of ``dependencies()``'s rules."""

    edges: tuple[Edge, ...] = ()

    def dependencies(self) -> list[Edge]:
        return list(self.edges)


def with_edges(schedule: Schedule, edges: list[Edge]) -> FixedEdges:
    fields = {f.name: getattr(schedule, f.name) for f in dataclasses.fields(Schedule)}
    return FixedEdges(**fields, edges=tuple(edges))


def program_order(schedule: Schedule) -> list[Edge]:
    return [((s, i - 1), (s, i)) for s, order in enumerate(schedule.stages) for i in range(1, len(order))]


def data_flow(schedule: Schedule) -> list[Edge]:
    return dependencies(dataclasses.replace(schedule, joint_receives=()))


def version_4(schedule: Schedule) -> list[Edge]:
    """Data flow plus the joint receives: instruction i also waits for the inputs of j."""
    edges = data_flow(schedule)
    inputs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for u, v in edges:
        if u[0] != v[0]:
            inputs.setdefault(v, []).append(u)
    for s, pairs in enumerate(schedule.joint_receives):
        for i, j in pairs:
            edges += [(u, (s, i)) for u in inputs.get((s, j), ())]
    return edges


def main() -> None:
    stages, chunks = 4, 2
    profile = split_into_chunks(load_example_profile(), chunks)
    print(f"profile: {profile.source}, {stages} stages x {chunks} chunks (stages split evenly)")
    print(f"{'microbatches x G':<18}{'DAG':<11}{'no-slowdown vs all-max':>24}{'worst point vs planned':>24}"
          f"{'saving planned':>16}")
    for microbatches, group in CASES:
        schedule = build_schedule("interleaved", stages, microbatches, chunks, group_size=group)
        waits = megatron_waits(stages, chunks, microbatches, group)
        real = InstructionDAG.from_schedule(
            with_edges(schedule, program_order(schedule) + [(u, v) for v, srcs in waits.items() for u in srcs]))
        all_max = simulate_plan(real, profile, max_frequency_plan(real, profile))
        for label, edges in (("data flow", data_flow(schedule)), ("v4", version_4(schedule)),
                             ("current", dependencies(schedule))):
            frontier = plan_frontier(with_edges(schedule, edges), profile)
            point = frontier.default_point()
            slow = simulate_plan(real, profile, point.freqs_mhz).time_s / all_max.time_s - 1
            worst = max(simulate_plan(real, profile, p.freqs_mhz).time_s / p.time_s - 1 for p in frontier.points)
            saving = 1 - point.energy_j / frontier.baseline_energy_j
            print(f"{f'{microbatches} x {group}':<18}{label:<11}{100 * slow:>+23.2f}%{100 * worst:>+23.2f}%"
                  f"{100 * saving:>15.1f}%")


if __name__ == "__main__":
    main()
