"""Exact (kind, microbatch, chunk) for every compute step of one megatron-core schedule call.

``forward_step`` is told its microbatch and model chunk; ``backward_step`` is not. It does
receive the very output object its forward returned (the schedules keep it in a queue), so
each forward's output is remembered by identity and looked up when its backward runs. That
is exact for 1F1B and interleaved orders alike, where counting backwards would have to
re-implement the schedule.

No torch or Megatron import here: the logic is tested with plain objects.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

from perseus.runtime import HookStateError, InstructionListener
from perseus.schedules import InstructionKind

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class StepInfo:
    """What one forward-backward call of megatron-core looks like."""

    schedule: str  # "1f1b" (also no-pipelining), "interleaved", or "megatron-combined-1f1b" (overlap_moe_expert_parallel_comm)
    num_microbatches: int
    num_chunks: int = 1
    group_size: int | None = None  # microbatch_group_size_per_vp_stage (interleaved and combined only)
    forward_only: bool = False
    overlap_p2p: bool = False  # the config's overlap_p2p_comm (interleaved only)
    seq_length: int | None = None
    micro_batch_size: int | None = None
    model_config: Any = field(default=None, compare=False, repr=False)  # megatron TransformerConfig
    # This rank's model chunks' parameters (names, shapes, dtypes): PipelineJob.stage_fingerprint.
    stage_fingerprint: str = field(default="", compare=False, repr=False)


ListenerForStep = Callable[[StepInfo], InstructionListener]



class ScheduleTracker:
    """Turns schedule calls into listener events; one per installed hook set.

    Forward-only (evaluation) calls report nothing: they are not part of the training
    iteration Perseus profiles and plans, and reporting forwards without backwards would
    break the runtime's plan-to-schedule match. Their compute runs at whatever clock the
    GPU holds.
    """

    def __init__(self, listener_for_step: ListenerForStep):
        self._listener_for_step = listener_for_step
        self._in_step = False
        self._listener: InstructionListener | None = None  # None: current call is not reported
        self._outputs: dict[int, tuple[Any, int, int]] = {}
        self._warned_outside_step = False

    @property
    def reporting(self) -> bool:
        return self._listener is not None

    def note_unreported_call(self) -> None:
        """A forward/backward ran unreported; warn once if that is because no step is open.

        That happens when the schedule function was fetched (``get_forward_backward_func()``)
        before the hooks were installed, so its calls bypass the step wrapper.
        """
        if not self._in_step and not self._warned_outside_step:
            self._warned_outside_step = True
            log.warning(
                "megatron forward_step ran outside a hooked forward-backward call and was not reported; "
                "call get_forward_backward_func() after perseus_megatron.enable()/install_hooks()"
            )

    @contextlib.contextmanager
    def step(self, info: StepInfo) -> Iterator[None]:
        """Brackets one forward-backward call; ``on_step_end`` only when it completes."""
        if self._in_step:
            raise HookStateError(
                "a megatron-core forward-backward call started inside another one; Perseus expects "
                "one schedule call at a time per process"
            )
        self._in_step = True
        self._outputs.clear()
        try:
            if not info.forward_only:
                listener = self._listener_for_step(info)
                listener.on_step_begin()
                self._listener = listener
            yield
            if self._listener is not None:
                if self._outputs:
                    log.warning("%d forward outputs had no backward in this step", len(self._outputs))
                self._listener.on_step_end()
        finally:
            self._in_step = False
            self._listener = None
            self._outputs.clear()

    def forward(self, microbatch: int | None, chunk: int | None, run: Callable[[], T]) -> T:
        """Run one forward step, reporting it and remembering its output for its backward."""
        listener = self._listener
        if listener is None:
            return run()
        if microbatch is None:
            raise HookStateError(
                "megatron-core called forward_step without current_microbatch; this megatron-core "
                "version is not supported by the Perseus hooks"
            )
        chunk = chunk or 0
        listener.on_instruction_begin("forward", microbatch, chunk)
        result = run()
        output = result[0] if isinstance(result, tuple) else result
        self._outputs[id(output)] = (output, microbatch, chunk)  # keep a reference: ids stay unique
        listener.on_instruction_end("forward", microbatch, chunk)
        return result

    def backward(self, output: Any, run: Callable[[], T]) -> T:
        """Run one backward step, reporting the microbatch and chunk of the forward that made ``output``."""
        listener = self._listener
        if listener is None:
            return run()
        entry = self._outputs.pop(id(output), None)
        if entry is None or entry[0] is not output:
            raise HookStateError(
                "megatron-core called backward_step with an output no forward_step of this iteration "
                "returned; the schedule is not one Perseus supports"
            )
        _, microbatch, chunk = entry
        listener.on_instruction_begin("backward", microbatch, chunk)
        result = run()
        listener.on_instruction_end("backward", microbatch, chunk)
        return result

    def combined(self, forward: tuple[int | None, int | None] | None, backward_output: Any, run: Callable[[], T]) -> T:
        """Run one ``combined_forward_backward_step`` of megatron-core's combined 1F1B: a forward
        alone (``forward`` = its (microbatch, chunk)), a backward alone (``backward_output``: the
        output its forward returned, as ``backward_step`` gets it), or both as one fused unit."""
        listener = self._listener
        if listener is None:
            return run()
        pair: tuple[int, int] | None = None
        if backward_output is not None:
            entry = self._outputs.pop(id(backward_output), None)
            if entry is None or entry[0] is not backward_output:
                raise HookStateError(
                    "megatron-core's combined 1F1B ran a backward of an output no forward of this iteration "
                    "returned; the schedule is not one Perseus supports"
                )
            pair = (entry[1], entry[2])
        kind: InstructionKind
        if forward is None:
            if pair is None:
                return run()  # neither part: nothing megatron-core's schedules call
            kind, microbatch, chunk = "backward", pair[0], pair[1]
            pair = None
        else:
            forward_microbatch, forward_chunk = forward
            if forward_microbatch is None:
                raise HookStateError("megatron-core's combined 1F1B ran a forward without current_microbatch; this "
                                     "megatron-core version is not supported by the Perseus hooks")
            kind = "forward_backward" if pair is not None else "forward"
            microbatch, chunk = int(forward_microbatch), int(forward_chunk or 0)
        # the pair only for a fused unit: listeners written for plain kinds keep their three arguments
        extra: tuple[()] | tuple[tuple[int, int]] = () if pair is None else (pair,)
        listener.on_instruction_begin(kind, microbatch, chunk, *extra)
        result = run()
        if forward is not None:
            output = result[0] if isinstance(result, tuple) else result
            self._outputs[id(output)] = (output, microbatch, chunk)
        listener.on_instruction_end(kind, microbatch, chunk, *extra)
        return result
