"""The planner's DAG against what megatron-core's interleaved exchanges make each stage wait for.

``megatron_p2p_model`` derives, from megatron-core's own send/receive rules, which instructions
each instruction really waits for. Every edge of Perseus' DAG (data flow and joint receives) must
be such a wait — for any ``microbatch_group_size_per_vp_stage``, not only the default — or the
planner would see a stall that megatron does not have. No torch needed.
"""

from __future__ import annotations

import dataclasses

import pytest

from megatron_p2p_model import megatron_waits, reaches
from perseus.errors import ScheduleError
from perseus.schedules import Instruction, Schedule, build_schedule
from perseus.schedules import dependencies


def cases() -> list[tuple[int, int, int, int]]:
    """(stages, chunks, microbatches, group size) that megatron-core runs, default and other groups."""
    out = []
    for pp in (2, 3, 4, 8):
        for chunks in (2, 3, 4):
            for group in sorted({pp, pp + 1, 2 * pp}):
                for microbatches in sorted({pp, group, 2 * group, 3 * pp, 2 * group + pp}):
                    try:
                        build_schedule("interleaved", pp, microbatches, chunks, group_size=group)
                    except ScheduleError:
                        continue
                    out.append((pp, chunks, microbatches, group))
    return out


def program_order(schedule: Schedule) -> list:
    return [((s, i - 1), (s, i)) for s, order in enumerate(schedule.stages) for i in range(1, len(order))]


def joint_edges(schedule: Schedule) -> set:
    """The DAG edges that only the joint receives add."""
    return set(dependencies(schedule)) - set(dependencies(dataclasses.replace(schedule, joint_receives=())))


def test_the_grid_has_other_group_sizes_with_joint_receives_and_all_warmup_stages():
    grid = cases()
    other = [c for c in grid if c[3] != c[0]]
    assert len(other) >= 40
    with_joint = [c for c in other if joint_edges(build_schedule("interleaved", c[0], c[2], c[1], group_size=c[3]))]
    assert len(with_joint) >= 40
    assert any(mb == pp for pp, _, mb, _ in grid)  # stages whose microbatches are all in warm-up


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap_p2p"])
@pytest.mark.parametrize("pp, chunks, microbatches, group", cases())
def test_every_dag_edge_is_a_wait_megatron_has(pp, chunks, microbatches, group, overlap):
    schedule = build_schedule("interleaved", pp, microbatches, chunks, group_size=group, overlap_p2p=overlap)
    waits = megatron_waits(pp, chunks, microbatches, group, overlap)
    real = reaches([len(order) for order in schedule.stages],
                   program_order(schedule) + [(u, v) for v, srcs in waits.items() for u in srcs])
    edges = dependencies(schedule)
    if overlap and group > pp:
        # With overlapped exchanges and a group larger than the pipeline, a ring-wrap receive (the
        # first stage's activations, the last stage's gradients) is waited for at the first
        # instruction of its kind that pops the receive queue, which can be later than the one
        # after the receive the DAG waits at: the DAG waits earlier than megatron there, a
        # stricter plan, never a slower one. Every other edge is exact.
        late = [(u, v) for u, v in edges if not real(u, v)]
        assert all({u[0], v[0]} == {0, pp - 1} and any(u in waits.get((v[0], w), ()) for w in range(v[1] + 1, len(schedule.stages[v[0]])))
                   for u, v in late), late
        edges = [e for e in edges if e not in late]
    assert all(real(u, v) for u, v in edges), [
        (schedule.stages[u[0]][u[1]].short(), u[0], schedule.stages[v[0]][v[1]].short(), v[0])
        for u, v in edges if not real(u, v)]


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap_p2p"])
@pytest.mark.parametrize("pp, chunks, microbatches, group", cases())
def test_every_wait_megatron_has_is_in_the_dag(pp, chunks, microbatches, group, overlap):
    """The converse: the DAG misses none of megatron's waits (without overlap: a forward's output
    sent only after its paired backward; either way: the first / last stage receiving from the
    other end early), nor the data flow, so the planner sees no slack megatron does not have."""
    schedule = build_schedule("interleaved", pp, microbatches, chunks, group_size=group, overlap_p2p=overlap)
    dag = reaches([len(order) for order in schedule.stages], dependencies(schedule))
    waits = megatron_waits(pp, chunks, microbatches, group, overlap)
    missing = [(u, v) for v, srcs in waits.items() for u in srcs if not dag(u, v)]
    assert missing == []
    data_flow = dependencies(dataclasses.replace(schedule, joint_receives=()))
    assert all(dag(u, v) for u, v in data_flow)


def test_the_dag_has_the_waits_the_data_flow_lacks():
    """Both kinds megatron has beyond the data flow appear as edges (4 stages × 2 chunks, G = 4)."""
    schedule = build_schedule("interleaved", 4, 16, 2, group_size=4)
    flow = dependencies(dataclasses.replace(schedule, joint_receives=()))
    flow_reaches = reaches([len(order) for order in schedule.stages], flow)
    extra = [(u, v) for u, v in dependencies(schedule) if not flow_reaches(u, v)]
    def inst(n: tuple[int, int]) -> Instruction:
        return schedule.stages[n[0]][n[1]]

    # (a) a steady forward's consumer waits for the backward paired with that forward
    assert any(inst(u).kind == "backward" and inst(v).kind == "forward" and u[0] + 1 == v[0] for u, v in extra)
    # (b) the first stage waits for activations the last stage sent, beyond the data flow (received early)
    assert any(u[0] == 3 and v[0] == 0 and inst(v).kind == "forward" for u, v in extra)


def test_overlapped_p2p_drops_the_waits_of_blocking_pairs():
    """With overlap_p2p_comm (Megatron-LM's default for interleaved runs) a forward's output leaves
    right after it: no consumer waits for a backward, and the DAG has fewer constraints than with
    megatron-core's blocking exchanges, so a plan for one is not a plan for the other."""
    blocking = build_schedule("interleaved", 4, 16, 2)
    overlapped = build_schedule("interleaved", 4, 16, 2, overlap_p2p=True)
    assert overlapped.stages == blocking.stages and overlapped != blocking
    def inst(n: tuple[int, int]) -> Instruction:
        return overlapped.stages[n[0]][n[1]]

    cross = [(u, v) for u, v in dependencies(overlapped) if u[0] != v[0]]
    assert not any(inst(u).kind == "backward" and inst(v).kind == "forward" for u, v in cross)
    # Every overlapped wait is one the blocking exchanges have too, not the other way round.
    sizes = [len(order) for order in blocking.stages]
    in_blocking, in_overlapped = reaches(sizes, dependencies(blocking)), reaches(sizes, dependencies(overlapped))
    assert all(in_blocking(u, v) for u, v in dependencies(overlapped))
    assert not all(in_overlapped(u, v) for u, v in dependencies(blocking))
    assert overlapped.variant_fields() == {"overlap_p2p": True} and blocking.variant_fields() == {}
    assert "overlapped p2p" in overlapped.describe()
    with pytest.raises(ScheduleError, match="interleaved schedule only"):
        build_schedule("1f1b", 4, 8, overlap_p2p=True)
