"""Exact (kind, microbatch, chunk) for every compute call of one torch pipelining ``step()``.

Every ``torch.distributed.pipelining`` schedule (torch 2.13) runs its compute through three
methods of each ``_PipelineStageBase``, each told the microbatch index first:
``forward_one_chunk`` (F), ``backward_one_chunk`` (full backward B, or with
``full_backward=False`` zero-bubble's input-gradient part I) and ``backward_weight_one_chunk``
(weight-gradient part W). So the stage the call is made on gives the chunk and the first
argument the microbatch; no schedule has to be re-implemented to know what ran.

DualPipeV's ``OVERLAP_F_B`` action runs a forward and then a full backward (torch 2.13 runs its
sub-actions one after the other). Which forwards open such a unit is read from torch's own action
list (``compat.fused_units``): the tracker reports one ``forward_backward`` unit from that
forward's begin to the paired backward's end, with the backward's (microbatch, chunk).

No torch import here: the logic is tested with plain objects.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, TypeVar

from perseus.runtime import HookStateError, InstructionListener
from perseus.schedules import InstructionKind

T = TypeVar("T")



class PipelineTracker:
    """Turns one schedule's ``step()`` and compute calls into listener events.

    ``step()`` is one training iteration: ``on_step_begin`` before it, ``on_step_end`` when it
    returns (not when it raises). ``eval()`` (it calls ``step()`` with backward disabled) and a
    ``step()`` of a schedule built without a loss (no backward) report nothing: they are not the
    iteration Perseus profiles and plans, and forwards without backwards would break the runtime's
    plan check. Compute outside ``step()`` is not reported either.
    """

    def __init__(self, listener: InstructionListener,
                 fused: dict[tuple[int, int], tuple[int, int]] | None = None) -> None:
        self.listener = listener
        self.fused = dict(fused or {})  # (forward's chunk, microbatch) -> (backward's microbatch, chunk)
        self._in_step = False
        self._in_eval = False
        self._reporting = False
        self._open: tuple[InstructionKind, int, int] | None = None
        self._unit: tuple[int, int, tuple[int, int]] | None = None  # an open fused unit: forward's (mb, chunk), backward

    @property
    def reporting(self) -> bool:
        return self._reporting

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Brackets ``eval()``: the ``step()`` inside it is not reported."""
        was, self._in_eval = self._in_eval, True
        try:
            yield
        finally:
            self._in_eval = was

    @contextlib.contextmanager
    def step(self, has_backward: bool) -> Iterator[None]:
        """Brackets one ``step()``; reported only for a training step outside ``eval()``."""
        if self._in_step:
            raise HookStateError("a pipelining step() started inside another one; Perseus expects one at a time")
        self._in_step = True
        report = has_backward and not self._in_eval
        try:
            if report:
                self.listener.on_step_begin()
                self._reporting = True
            yield
            if self._unit is not None:
                raise HookStateError(f"the step ended inside a fused unit: forward of microbatch {self._unit[0]} ran "
                                     f"but not the backward of microbatch {self._unit[2][0]} paired with it")
            if report:
                self._reporting = False
                self.listener.on_step_end()
        finally:
            self._in_step = False
            self._reporting = False
            self._open = None
            self._unit = None

    def compute(self, kind: InstructionKind, microbatch: Any, chunk: int, run: Callable[[], T]) -> T:
        """Run one compute call, reporting it when inside a reported step."""
        if not self._reporting:
            return run()
        if not isinstance(microbatch, int) or isinstance(microbatch, bool):
            raise HookStateError(f"torch pipelining called {kind} with microbatch {microbatch!r}, not an index")
        if self._open is not None:
            raise HookStateError(
                f"{kind} of microbatch {microbatch} started inside {self._open[0]} of microbatch {self._open[1]}: "
                "the schedule overlaps compute (like DualPipeV's OVERLAP_F_B), which Perseus does not support"
            )
        unit = self._unit
        if unit is not None:  # the second part of a fused unit: its paired backward, and nothing else
            if (kind, (microbatch, chunk)) != ("backward", unit[2]):
                raise HookStateError(
                    f"{kind} of microbatch {microbatch} (chunk {chunk}) ran inside the fused unit of forward "
                    f"microbatch {unit[0]}, which pairs the backward of microbatch {unit[2][0]} (chunk {unit[2][1]})")
            self._open = (kind, microbatch, chunk)
            result = run()
            self._open = self._unit = None
            self.listener.on_instruction_end("forward_backward", unit[0], unit[1], unit[2])
            return result
        pair = self.fused.get((chunk, microbatch)) if kind == "forward" else None
        self._open = (kind, microbatch, chunk)
        if pair is not None:  # a fused unit begins with its forward and ends after its backward
            self.listener.on_instruction_begin("forward_backward", microbatch, chunk, pair)
            result = run()
            self._open, self._unit = None, (microbatch, chunk, pair)
            return result
        self.listener.on_instruction_begin(kind, microbatch, chunk)
        result = run()
        self.listener.on_instruction_end(kind, microbatch, chunk)
        self._open = None
        return result
