"""ScheduleTracker with plain objects: exact backward attribution, forward-only silence, misuse errors."""

from __future__ import annotations

import logging

import pytest

import perseus.runtime
from perseus.runtime.job import RecordingListener
from perseus.schedules import Instruction
from perseus_megatron.tracker import HookStateError, ScheduleTracker, StepInfo

TRAIN = StepInfo("interleaved", num_microbatches=2, num_chunks=2)


def _tracker(listener: RecordingListener, infos: list[StepInfo] | None = None) -> ScheduleTracker:
    def listener_for_step(info: StepInfo) -> RecordingListener:
        if infos is not None:
            infos.append(info)
        return listener

    return ScheduleTracker(listener_for_step)


def test_backward_takes_microbatch_and_chunk_from_its_forward_output_not_from_call_order():
    recorder = RecordingListener()
    tracker = _tracker(recorder)
    outputs = {key: object() for key in [(0, 0), (1, 0), (0, 1), (1, 1)]}
    with tracker.step(TRAIN):
        for mb, chunk in outputs:
            result = tracker.forward(mb, chunk, lambda mb=mb, chunk=chunk: (outputs[(mb, chunk)], 7))
            assert result == (outputs[(mb, chunk)], 7)  # the wrapped call's result passes through
        # backwards in an order no counter would guess
        for key in [(1, 1), (0, 0), (0, 1), (1, 0)]:
            assert tracker.backward(outputs[key], lambda: "grad") == "grad"
    assert recorder.steps == [
        [Instruction("forward", 0, 0), Instruction("forward", 1, 0), Instruction("forward", 0, 1),
         Instruction("forward", 1, 1), Instruction("backward", 1, 1), Instruction("backward", 0, 0),
         Instruction("backward", 0, 1), Instruction("backward", 1, 0)]
    ]


def test_forward_of_a_non_tuple_result_and_missing_chunk_means_chunk_zero():
    recorder = RecordingListener()
    tracker = _tracker(recorder)
    out = object()
    with tracker.step(StepInfo("1f1b", 1)):
        tracker.forward(0, None, lambda: out)
        tracker.backward(out, lambda: None)
    assert recorder.steps == [[Instruction("forward", 0, 0), Instruction("backward", 0, 0)]]


def test_forward_only_calls_report_nothing_and_do_not_create_a_listener():
    recorder, infos = RecordingListener(), []
    tracker = _tracker(recorder, infos)
    with tracker.step(StepInfo("1f1b", 2, forward_only=True)):
        assert not tracker.reporting
        tracker.forward(0, 0, lambda: (object(), 0))
    assert recorder.steps == [] and infos == []


def test_step_info_reaches_the_listener_factory():
    infos: list[StepInfo] = []
    tracker = _tracker(RecordingListener(), infos)
    with tracker.step(TRAIN):
        pass
    assert infos == [TRAIN]


def test_backward_of_an_unknown_output_is_an_error():
    tracker = _tracker(RecordingListener())
    assert HookStateError is perseus.runtime.HookStateError, "the runtime's one class, under its old name here"
    with pytest.raises(HookStateError, match="no forward_step of this iteration"):
        with tracker.step(TRAIN):
            tracker.backward(object(), lambda: None)


def test_forward_without_microbatch_index_names_the_version_problem():
    tracker = _tracker(RecordingListener())
    with pytest.raises(HookStateError, match="current_microbatch"):
        with tracker.step(TRAIN):
            tracker.forward(None, 0, lambda: (object(), 0))


def test_nested_schedule_calls_are_rejected():
    tracker = _tracker(RecordingListener())
    with tracker.step(TRAIN):
        with pytest.raises(HookStateError, match="inside another"):
            with tracker.step(TRAIN):
                pass


def test_a_failing_step_skips_step_end_and_resets_state():
    class Ends(RecordingListener):
        ends = 0

        def on_step_end(self) -> None:
            Ends.ends += 1

    tracker = _tracker(Ends())
    with pytest.raises(RuntimeError):
        with tracker.step(TRAIN):
            tracker.forward(0, 0, lambda: (object(), 0))
            raise RuntimeError("boom")
    assert Ends.ends == 0
    with tracker.step(TRAIN):  # usable again
        pass
    assert Ends.ends == 1


def test_unreported_forward_outside_a_step_warns_once(caplog):
    tracker = _tracker(RecordingListener())
    with caplog.at_level(logging.WARNING, logger="perseus_megatron.tracker"):
        tracker.note_unreported_call()
        tracker.note_unreported_call()
    assert sum("get_forward_backward_func" in r.message for r in caplog.records) == 1


def test_combined_step_reports_a_forward_a_fused_unit_or_a_backward_and_refuses_a_forward_without_microbatch():
    recorder = RecordingListener()
    tracker = _tracker(recorder)
    first, second = object(), object()
    with tracker.step(StepInfo("megatron-combined-1f1b", 2)):
        tracker.combined((0, None), None, lambda: (first, 0))  # forward alone, chunk missing: chunk 0
        tracker.combined((1, 0), first, lambda: (second, 0))  # forward of 1 with the backward of 0: one unit
        assert tracker.combined(None, second, lambda: "grad") == "grad"  # backward alone
        assert tracker.combined(None, None, lambda: "nothing") == "nothing"  # neither part: not reported
    assert recorder.steps == [[Instruction("forward", 0, 0), Instruction.fused(1, 0, 0, 0),
                               Instruction("backward", 1, 0)]]
    with tracker.step(StepInfo("megatron-combined-1f1b", 1)):
        with pytest.raises(HookStateError, match="without current_microbatch"):
            tracker.combined((None, 0), None, lambda: None)
