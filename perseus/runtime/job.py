"""The event vocabulary between framework adapters and the runtime.

Adapters translate framework callbacks into exactly these calls and nothing else, so the
runtime never imports Megatron or DeepSpeed and adapters stay a few dozen lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

from perseus.errors import ConfigError
from perseus.schedules import Instruction, InstructionKind, Schedule, build_schedule


# A fused ``forward_backward`` unit's backward (microbatch, chunk), reported with the unit; None otherwise.
FusedBackward = tuple[int, int] | None


@dataclass(frozen=True)
class PipelineJob:
    """Where this process sits in the parallel job, and which schedule it runs."""

    num_stages: int
    num_microbatches: int
    stage: int
    schedule: str = "1f1b"
    num_chunks: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    rank: int = 0
    world_size: int = 1
    # megatron-core's microbatch_group_size_per_vp_stage (interleaved only; None: the stage count).
    # It changes the instruction order, so a plan made for one group size never runs under another.
    group_size: int | None = None
    # megatron-core's overlap_p2p_comm (interleaved only): the same order with other waits
    # (perseus.schedules.exchanges), so it is part of the schedule, its plan and its cache key.
    overlap_p2p: bool = False
    # What determines the measured profile besides the schedule (model size, hidden size, sequence
    # length, dtype, layer specs, ...), the same on every rank: the adapter fills it; the runtime
    # hashes it into its cache key (perseus/runtime/supply/fingerprint.py).
    model_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # This rank's stage's parameters (names, shapes, dtypes; ``fingerprint.stage_fingerprint``),
    # which only this stage's ranks hold: rank 0 gathers every stage's into the cache key, so a
    # model changed on any stage misses the cache. Empty: the adapter cannot see them.
    stage_fingerprint: str = ""

    def build_schedule(self) -> Schedule:
        return build_schedule(self.schedule, self.num_stages, self.num_microbatches, self.num_chunks, self.group_size,
                              self.overlap_p2p)

    def check(self) -> None:
        """A rank outside the job is a ``ConfigError`` before training, not an index error in it."""
        checks = [
            (0 <= self.stage < self.num_stages, f"stage {self.stage} is outside 0..{self.num_stages - 1}"),
            (0 <= self.dp_rank < self.dp_size, f"dp_rank {self.dp_rank} is outside 0..{self.dp_size - 1}"),
            (0 <= self.tp_rank < self.tp_size, f"tp_rank {self.tp_rank} is outside 0..{self.tp_size - 1}"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(f"perseus: invalid PipelineJob: {problem}")


@runtime_checkable
class InstructionListener(Protocol):
    """Receives one training iteration's events, in the order the framework executes them."""

    def on_step_begin(self) -> None: ...

    def on_step_end(self) -> None: ...

    # ``backward``: a fused ``forward_backward`` unit's backward (microbatch, chunk); None otherwise.
    def on_instruction_begin(self, kind: InstructionKind, microbatch: int, chunk: int = 0,
                             backward: FusedBackward = None) -> None: ...

    def on_instruction_end(self, kind: InstructionKind, microbatch: int, chunk: int = 0,
                           backward: FusedBackward = None) -> None: ...


@dataclass
class RecordingListener:
    """Records executed instruction orders per step; used to check adapters against schedules."""

    steps: list[list[Instruction]] = field(default_factory=list)
    _open: Instruction | None = None

    def on_step_begin(self) -> None:
        self.steps.append([])

    def on_step_end(self) -> None:
        pass

    def on_instruction_begin(self, kind: InstructionKind, microbatch: int, chunk: int = 0,
                             backward: FusedBackward = None) -> None:
        if self._open is not None:
            raise AssertionError(f"instruction {self._open} began before the previous one ended")
        if not self.steps:
            self.steps.append([])
        self._open = Instruction(kind, microbatch, chunk, *(backward or ()))

    def on_instruction_end(self, kind: InstructionKind, microbatch: int, chunk: int = 0,
                           backward: FusedBackward = None) -> None:
        inst = Instruction(kind, microbatch, chunk, *(backward or ()))
        if inst != self._open:
            raise AssertionError(f"instruction {inst} ended but {self._open} was running")
        self.steps[-1].append(inst)
        self._open = None
