"""megatron-core's own schedule-order oracle agrees with ``perseus.schedules`` on its test grid.

Megatron-LM's ``tests/unit_tests/pipeline_parallel/test_schedules.py::test_get_pipeline_parallel_order``
builds each stage's order from ``get_pp_rank_microbatches`` (warm-up count),
``get_schedule_table`` ((microbatch, chunk) per virtual microbatch) and
``convert_schedule_table_to_order`` (+chunk for a forward, -chunk for a backward). Those three
are pure Python; they are loaded from the real release archives with ``ast`` (the test module's
torch/megatron imports do not run) and compared, stage by stage, with Perseus' orders on the
test's whole grid. No torch needed.
"""

from __future__ import annotations

import re

import pytest

from megatron_lm_archive import order_test_grid, read_member, schedule_oracle
from perseus.errors import ScheduleError
from perseus.schedules import Instruction, build_schedule

VERSIONS = ("0.16.1", "0.19.0")


def oracle_order(oracle, pp: int, stage: int, vp: int | None, microbatches: int, group: int) -> list[Instruction]:
    """One stage's (kind, microbatch, chunk) order as megatron-core's helpers define it."""
    chunks = vp or 1
    oracle.set_rank(pp, stage, vp)
    _, _, warmup, _ = oracle.get_pp_rank_microbatches(microbatches, chunks, group, False)
    table = oracle.get_schedule_table(microbatches, chunks, group)
    order = oracle.convert_schedule_table_to_order(warmup, chunks, table)
    # The order names chunks only (+c+1 forward, -(c+1) backward); the n-th forward of chunk c is
    # the n-th table entry of chunk c, and backwards run the chunks in reverse.
    by_chunk = {c: [m for m, tc in table if tc == c] for c in range(chunks)}
    seen: dict[int, int] = {}
    out = []
    for o in order:
        n = seen.get(o, 0)
        seen[o] = n + 1
        if o > 0:
            out.append(Instruction("forward", by_chunk[o - 1][n], o - 1))
        else:
            chunk = -o - 1
            out.append(Instruction("backward", by_chunk[chunks - 1 - chunk][n], chunk))
    return out


def megatron_refuses(pp: int, vp: int | None, microbatches: int, group: int) -> bool:
    """The interleaved schedule's own ValueErrors (forward_backward_pipelining_with_interleaving)."""
    if vp is None or pp == 1:
        return False
    return not pp <= group <= microbatches or 0 < microbatches % group < pp


@pytest.mark.parametrize("version", VERSIONS)
def test_megatron_refusals_are_the_ones_this_test_encodes(version):
    source = read_member(version, "megatron/core/pipeline_parallel/schedules.py")
    assert re.search(r"microbatch_group_size_per_vp_stage > num_microbatches\s+or config\.microbatch_group_size_per_vp_stage"
                     r" < pipeline_parallel_size", source)
    assert "final_microbatch_group_size = num_microbatches % config.microbatch_group_size_per_vp_stage" in source
    assert "if 0 < final_microbatch_group_size < pipeline_parallel_size:" in source


@pytest.mark.parametrize("version", VERSIONS)
def test_perseus_orders_equal_megatron_order_oracle_on_its_whole_test_grid(version):
    oracle = schedule_oracle(version)
    grid = order_test_grid(version)
    assert len(grid) == 56  # 7 (pp, group) pairs x 2 microbatch counts x 4 virtual sizes
    compared = refused = 0
    for case in grid:
        pp = case["pipeline_model_parallel_size"]
        vp = case["virtual_pipeline_model_parallel_size"]
        mb = case["num_microbatches"]
        group = case["microbatch_group_size_per_vp_stage"]
        if pp == 1 and vp is not None:
            continue  # megatron's test skips these too
        name = "1f1b" if vp is None else "interleaved"
        chunks = vp or 1
        if megatron_refuses(pp, vp, mb, group):
            with pytest.raises(ScheduleError):
                build_schedule(name, pp, mb, chunks, group_size=group)
            refused += 1
            continue
        schedule = build_schedule(name, pp, mb, chunks, group_size=group if vp else None)
        for stage in range(pp):
            expected = oracle_order(oracle, pp, stage, vp, mb, group)
            assert list(schedule.stages[stage]) == expected, (case, stage)
            compared += 1
        if vp is not None and group != pp:
            # a non-default group size changes the order, so it is part of the job's shape
            assert build_schedule(name, pp, mb, chunks).stages != schedule.stages, case
    assert (compared, refused) == (130, 15), (compared, refused)  # stage orders compared, cases both refuse


@pytest.mark.parametrize("group", [4, 6, 8])
def test_joint_receives_follow_the_order_for_any_group_size(group):
    """Every steady (forward, backward) pair is one joint exchange, whatever the group size."""
    schedule = build_schedule("interleaved", 4, 24, 2, group_size=group)
    for stage, order in enumerate(schedule.stages):
        pairs = schedule.joint_receives[stage]
        first_backward = next(i for i, inst in enumerate(order) if inst.kind == "backward")
        assert pairs[0] == (first_backward - 1, first_backward)
        for i, j in pairs:
            assert order[i].kind == "forward" and order[j].kind == "backward" and j == i + 1
        steady_forwards = sum(1 for inst in order[first_backward - 1:] if inst.kind == "forward")
        assert len(pairs) == steady_forwards


@pytest.mark.parametrize("version", VERSIONS)
def test_all_warmup_stages_have_no_joint_exchange_in_megatron(version):
    """The warm-up's last joint exchange is skipped when every microbatch is in warm-up."""
    source = read_member(version, "megatron/core/pipeline_parallel/schedules.py")
    assert re.search(r"k == \(num_warmup_microbatches - 1\)\s+and not config\.overlap_p2p_comm\s+"
                     r"and not forward_only\s+and not are_all_microbatches_in_warmup", source)


def test_interleaved_dags_are_acyclic_including_all_warmup_stages():
    """4 stages x 2 chunks x 4 microbatches (stages 0 and 1 all in warm-up) once built a cyclic DAG."""
    from perseus.schedules.dag import InstructionDAG

    schedule = build_schedule("interleaved", 4, 4, 2)
    assert schedule.joint_receives[0] == () and schedule.joint_receives[1] == ()
    assert schedule.joint_receives[2] == ((6, 7), (8, 9))
    for stages in (2, 3, 4, 8):
        for chunks in (2, 3, 4):
            for microbatches in range(stages, 3 * stages + 1):
                try:
                    schedule = build_schedule("interleaved", stages, microbatches, chunks)
                except ScheduleError:
                    continue
                InstructionDAG.from_schedule(schedule)  # raises on a cycle
