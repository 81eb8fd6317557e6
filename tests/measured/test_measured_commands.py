"""Merak's 1F1B command stream: its lengths match every rank's power_states, its compute order is 1F1B."""

import json

import pytest

from perseus.measured import command_stream
from perseus.schedules import build_schedule


def test_stream_lengths_for_four_stages_and_128_microbatches():
    assert [len(command_stream(4, 128, s)) for s in range(4)] == [518, 520, 518, 516]


@pytest.mark.parametrize("stages,microbatches", [(1, 1), (2, 3), (4, 24), (4, 32), (5, 7), (8, 12)])
def test_compute_order_is_the_project_s_1f1b(stages, microbatches):
    schedule = build_schedule("1f1b", stages, microbatches)
    for stage in range(stages):
        stream = command_stream(stages, microbatches, stage)
        compute = [(c.kind, c.microbatch) for c in stream if c.kind in ("forward", "backward")]
        assert compute == [(i.kind, i.microbatch) for i in schedule.stages[stage]]
        loads = [c.microbatch for c in stream if c.kind == "load"]
        assert loads == (list(range(microbatches)) if stage in (0, stages - 1) else [])
        assert [c.name for c in stream[-3:]] == ["ReduceTiedGrads", "ReduceGrads", "OptimizerStep"]


def test_every_load_comes_right_before_its_forward():
    stream = command_stream(4, 8, 0)
    for i, command in enumerate(stream):
        if command.kind == "load":
            assert stream[i + 1].kind == "forward" and stream[i + 1].microbatch == command.microbatch


def test_order_matches_every_rank_s_power_states_in_all_five_workloads(workload_dirs):
    """Read straight from the files: each rank's clock list is as long as its stage's stream."""
    from perseus.measured import parse_workload_name

    assert len(workload_dirs) == 5
    for directory in workload_dirs.values():
        shape = parse_workload_name(directory.name)
        for path in sorted(directory.glob("*.sched.json")):
            for rank in json.loads(path.read_text()):
                expected = len(command_stream(shape.stages, shape.microbatches, rank["rank"]))
                assert len(rank["power_states"]) == expected, (path, rank["rank"])
