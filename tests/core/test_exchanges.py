"""megatron-core's interleaved exchanges as DAG edges, on small cases worked out by hand."""

from __future__ import annotations

from perseus.schedules.exchanges import megatron_interleaved_waits
from perseus.schedules import Instruction as I
from perseus.schedules import build_schedule
from perseus.schedules import dependencies


def _at(schedule, stage: int, inst: I) -> tuple[int, int]:
    return stage, schedule.stages[stage].index(inst)


def test_a_steady_forwards_output_leaves_after_its_paired_backward():
    # 2 stages x 2 chunks x 4 microbatches: stage 1 runs the steady pair F2.c0, B0.c0 and only
    # then the exchange that sends F2.c0's activation to stage 0 (virtual stage 2), so stage 0's
    # F2.c1 waits for B0.c0 as well.
    s = build_schedule("interleaved", 2, 4, 2)
    f2 = _at(s, 1, I("forward", 2, 0))
    assert s.stages[1][f2[1] + 1] == I("backward", 0, 0)
    edges = set(megatron_interleaved_waits(s))
    assert ((1, f2[1] + 1), _at(s, 0, I("forward", 2, 1))) in edges
    assert (f2, _at(s, 0, I("forward", 2, 1))) not in edges  # the bare data-flow edge is implied
    assert set(dependencies(s)) >= edges



def test_with_overlapped_p2p_a_steady_forwards_output_leaves_right_after_it():
    # The same pipeline with megatron-core's overlap_p2p_comm: stage 1 posts F2.c0's send right
    # after F2.c0 (pp_post_forward), so stage 0's F2.c1 waits for F2.c0 only, not for B0.c0.
    s = build_schedule("interleaved", 2, 4, 2, overlap_p2p=True)
    f2 = _at(s, 1, I("forward", 2, 0))
    edges = set(megatron_interleaved_waits(s))
    assert (f2, _at(s, 0, I("forward", 2, 1))) in edges
    assert ((1, f2[1] + 1), _at(s, 0, I("forward", 2, 1))) not in edges
    # and no forward waits for a backward's input (no joint receives)
    assert not any(s.stages[v[0]][v[1]].kind == "forward" and s.stages[u[0]][u[1]].kind == "backward" for u, v in edges)

def test_the_first_stage_receives_from_the_last_one_pp_virtual_microbatches_later():
    # 2 stages x 2 chunks x 6 microbatches, group size 3: table F0 F1 F2 F0.c1 F1.c1 F2.c1 ...
    # Stage 0 receives at the exchange before its forward j what stage 1 sent as forward j - 2:
    # F0.c0's activation arrives before F2.c0 (j = 2), a forward that does not need it.
    s = build_schedule("interleaved", 2, 6, 2, group_size=3)
    edges = set(megatron_interleaved_waits(s))
    assert (_at(s, 1, I("forward", 0, 0)), _at(s, 0, I("forward", 2, 0))) in edges
    assert (_at(s, 1, I("forward", 1, 0)), _at(s, 0, I("forward", 0, 1))) in edges
    # the last stage's gradients come round the same way: B4.c1's (stage 0's cool-down) arrives
    # before stage 1's B3, one backward before B4 needs it
    assert (_at(s, 0, I("backward", 4, 1)), _at(s, 1, I("backward", 3, 0))) in edges
    assert len(edges) == len(megatron_interleaved_waits(s))  # each wait once

def test_schedules_without_megatron_exchanges_keep_the_data_flow():
    for name, chunks in (("1f1b", 1), ("torch-interleaved", 2), ("gpipe", 1)):
        s = build_schedule(name, 4, 8, chunks)
        cross = [(u, v) for u, v in dependencies(s) if u[0] != v[0]]
        for u, v in cross:  # each edge is one tensor from its producer to its consumer
            a, b = s.stages[u[0]][u[1]], s.stages[v[0]][v[1]]
            assert a.microbatch == b.microbatch and a.kind == b.kind, (name, a, b)
