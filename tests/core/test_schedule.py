"""Schedules must reproduce the frameworks' per-stage orders exactly."""

import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.errors import ScheduleError
from perseus.schedules import build_schedule
from perseus.schedules import dependencies


def labels(schedule, stage):
    return " ".join(inst.short() for inst in schedule.stages[stage])


def test_1f1b_orders_match_megatron_and_deepspeed():
    # Orders as DeepSpeed's TrainSchedule and megatron-core's non-interleaved 1F1B execute them
    # (checked by hand against both sources for 4 stages × 6 microbatches).
    s = build_schedule("1f1b", 4, 6)
    assert labels(s, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert labels(s, 1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
    assert labels(s, 2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"
    assert labels(s, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


def test_1f1b_with_fewer_microbatches_than_stages():
    s = build_schedule("1f1b", 4, 2)
    assert labels(s, 0) == "F0 F1 B0 B1"
    assert labels(s, 3) == "F0 B0 F1 B1"


def test_interleaved_orders_follow_megatron_schedule_table():
    # 2 stages × 2 chunks × 4 microbatches, group size 2: warm-up 4 on stage 0, 2 on stage 1.
    s = build_schedule("interleaved", 2, 4, 2)
    assert labels(s, 0) == "F0 F1 F0.c1 F1.c1 F2 B0.c1 F3 B1.c1 F2.c1 B0 F3.c1 B1 B2.c1 B3.c1 B2 B3"
    assert labels(s, 1) == "F0 F1 F0.c1 B0.c1 F1.c1 B1.c1 F2 B0 F3 B1 F2.c1 B2.c1 F3.c1 B3.c1 B2 B3"


def test_gpipe_runs_all_forwards_first():
    assert labels(build_schedule("gpipe", 2, 3), 1) == "F0 F1 F2 B0 B1 B2"


@pytest.mark.parametrize("name,stages,mbs,chunks", [("1f1b", 8, 12, 1), ("interleaved", 4, 8, 2), ("interleaved", 4, 12, 3), ("gpipe", 3, 4, 1)])
def test_every_instruction_appears_once_and_dag_is_acyclic(name, stages, mbs, chunks):
    s = build_schedule(name, stages, mbs, chunks)
    for stage in s.stages:
        assert len(stage) == 2 * mbs * chunks
        assert len(set(stage)) == len(stage)
    dag = InstructionDAG.from_schedule(s)  # raises on a cycle (a deadlocking order)
    assert sorted(dag.topo_order.tolist()) == list(range(s.num_instructions))


def test_dependencies_chain_forward_and_backward_across_virtual_stages():
    s = build_schedule("interleaved", 2, 4, 2)
    edges = set(dependencies(s))
    pos = {(st, inst): i for st, insts in enumerate(s.stages) for i, inst in enumerate(insts)}
    from perseus.schedules import Instruction as I

    # F(m) on virtual stage 1 (stage 1, chunk 0) feeds virtual stage 2 (stage 0, chunk 1).
    assert _reaches(edges, (1, pos[(1, I("forward", 2, 0))]), (0, pos[(0, I("forward", 2, 1))]))
    # B(m) on virtual stage 2 (stage 0, chunk 1) feeds virtual stage 1 (stage 1, chunk 0).
    assert _reaches(edges, (0, pos[(0, I("backward", 2, 1))]), (1, pos[(1, I("backward", 2, 0))]))
    # megatron's exchanges (perseus/schedules/exchanges.py) carry the data flow: an edge, or a path through
    # the instruction after which the tensor is sent and the one before which it is received
    assert not _reaches(edges, (0, pos[(0, I("forward", 2, 1))]), (1, pos[(1, I("forward", 2, 0))]))


def _reaches(edges, u, v) -> bool:
    """A path of ``edges`` leads from node u to node v."""
    succs: dict = {}
    for a, b in edges:
        succs.setdefault(a, []).append(b)
    seen, todo = {u}, [u]
    while todo:
        for b in succs.get(todo.pop(), ()):
            if b == v:
                return True
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return False


def test_interleaved_steady_forwards_also_wait_for_the_next_backwards_input():
    # megatron-core (no p2p overlap) ends the last warm-up forward and every steady F/B pair with
    # send_forward_backward_recv_forward_backward: the next forward starts only once the next
    # backward's gradient has arrived too. Stage 0 (warm-up 4): F2 waits for B0.c1's input,
    # which stage 1 produces (virtual stage 3 → 2).
    from perseus.schedules import Instruction as I

    s = build_schedule("interleaved", 2, 4, 2)
    assert s.joint_receives[0] == ((4, 5), (6, 7), (8, 9), (10, 11))
    assert s.joint_receives[1] == ((2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13))
    pos = {(st, inst): i for st, insts in enumerate(s.stages) for i, inst in enumerate(insts)}
    edges = set(dependencies(s))
    assert ((1, pos[(1, I("backward", 0, 1))]), (0, pos[(0, I("forward", 2, 0))])) in edges
    # stage 1's F1.c1 waits for B1.c1's input, which it computes itself after its own forward
    # (last virtual stage): no extra edge
    assert not [e for e in edges if e[1] == (1, pos[(1, I("forward", 1, 1))]) and e[0][0] == 0
                and s.stages[0][e[0][1]].kind == "backward"]
    # plain 1F1B receives each input right before the instruction that needs it
    assert build_schedule("1f1b", 4, 8).joint_receives == ()


@pytest.mark.parametrize(
    "args,message",
    [
        (("1f1b", 0, 4), "stages"),
        (("1f1b", 2, 4, 2), "no virtual chunks"),
        (("interleaved", 2, 4, 1), "at least 2 chunks"),
        (("interleaved", 4, 2, 2), "microbatch group size"),
        (("pipedream", 2, 4), "unknown schedule"),
    ],
)
def test_impossible_configurations_are_clear_errors(args, message):
    with pytest.raises(ScheduleError, match=message):
        build_schedule(*args)
