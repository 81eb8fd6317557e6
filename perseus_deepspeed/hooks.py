"""Report a DeepSpeed ``PipelineEngine``'s forward and backward instructions to a listener.

Why it is done this way:

- ``PipelineEngine._exec_schedule`` dispatches through ``self._INSTRUCTION_MAP[type(cmd)]``,
  a class-level dict whose values are the plain functions captured when the class was defined.
  Replacing ``_exec_forward_pass`` on the class or the instance changes nothing. The hooks give
  *this engine* its own copy of the map with ``ForwardPass``/``BackwardPass`` wrapped; other
  engines and the class are untouched.
- DeepSpeed instructions carry only a ``buffer_id`` (several microbatches share a buffer). The
  microbatch comes from the schedule itself: the wrapped ``_exec_schedule`` counts the steps of
  the ``TrainSchedule`` as they are yielded and the instruction hook asks the schedule's own
  ``_step_to_micro_batch(step)``, then checks that the buffer and direction agree.
- ``on_step_begin``/``on_step_end`` wrap ``train_batch``. ``eval_batch`` runs an
  ``InferenceSchedule`` that is not tracked, so its forwards are executed unreported.

A DeepSpeed patched with ``patches/deepspeed-pipe-engine.patch`` makes these calls in its own
source; on such an engine the hooks only set the listener on the instance.

Everything is installed as instance attributes and removed by ``HookHandle.uninstall()``, which
restores what the instance had before (normally: nothing, so the class methods show through).
"""

from __future__ import annotations

import warnings
from types import MethodType
from typing import Any, Callable, Iterator

from perseus.errors import PerseusError
from perseus.runtime import HooksAlreadyInstalled, InstructionListener
from perseus.schedules import InstructionKind
from perseus_deepspeed.compat import UnsupportedDeepSpeedFeature, check_engine, deepspeed_version, load_pipe_modules

_HANDLE_ATTRIBUTE = "_perseus_hook_handle"
_PATCHED = ("_INSTRUCTION_MAP", "_exec_schedule", "train_batch")
_SOURCE_LISTENER = "_perseus_listener"  # set on engines patched with patches/deepspeed-pipe-engine.patch
_MISSING = object()



class ScheduleMismatch(PerseusError):
    """The instruction DeepSpeed executes disagrees with the microbatch derived from its schedule."""


class TrackedTrainSchedule:
    """A ``TrainSchedule`` seen through: same steps, plus the index of the step being executed."""

    def __init__(self, schedule: Any) -> None:
        self.schedule = schedule
        self.step_id = -1

    def num_pipe_buffers(self) -> int:
        return self.schedule.num_pipe_buffers()

    def __iter__(self) -> Iterator[list[Any]]:
        for step_id, cmds in enumerate(self.schedule):
            self.step_id = step_id
            yield cmds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.schedule, name)

    def microbatch(self, kind: InstructionKind, buffer_id: int) -> int:
        """Microbatch of the ``kind`` instruction in the current step; checked against the buffer."""
        microbatch, is_forward = self.schedule._step_to_micro_batch(self.step_id)
        if (kind == "forward") != is_forward or not self.schedule._valid_micro_batch(microbatch) or (
            self.schedule._buffer_idx(microbatch) != buffer_id
        ):
            raise ScheduleMismatch(
                f"deepspeed {deepspeed_version()}: step {self.step_id} of stage {self.schedule.stage_id}'s "
                f"TrainSchedule maps to microbatch {microbatch} ({'forward' if is_forward else 'backward'}), but the "
                f"engine ran a {kind} on buffer {buffer_id}; this DeepSpeed's schedule differs from the one Perseus "
                "was written for (report the version)"
            )
        return microbatch


class HookHandle:
    """Installed hooks on one engine; ``uninstall()`` undoes them (idempotent), as in every adapter."""

    def __init__(self, engine: Any, listener: InstructionListener, saved: dict[str, Any]) -> None:
        self.engine = engine
        self.listener = listener
        self._saved = saved
        self.tracked: TrackedTrainSchedule | None = None  # the TrainSchedule now executing, if any
        self.in_train_batch = False
        self.steps = 0  # completed train_batch calls while installed
        self.source_hooks = False  # True: the engine's source is patched and calls the listener itself

    @property
    def installed(self) -> bool:
        return self.engine is not None

    def uninstall(self) -> None:
        """Restore the engine's own attributes; the class-level methods and map show through again."""
        engine = self.engine
        if engine is None:
            return
        self.engine = None
        for name, value in self._saved.items():
            if value is _MISSING:
                engine.__dict__.pop(name, None)
            else:
                engine.__dict__[name] = value
        if engine.__dict__.get(_HANDLE_ATTRIBUTE) is self:
            del engine.__dict__[_HANDLE_ATTRIBUTE]

    def remove(self) -> None:
        """Deprecated name of ``uninstall`` (the other adapters' handles never had it)."""
        warnings.warn("perseus_deepspeed: HookHandle.remove() is deprecated; call uninstall()", DeprecationWarning,
                      stacklevel=2)
        self.uninstall()


def installed_handle(engine: Any) -> HookHandle | None:
    """The active hook handle of ``engine``, if any."""
    return engine.__dict__.get(_HANDLE_ATTRIBUTE)


def _instruction_wrapper(handle: HookHandle, original: Callable[..., Any], kind: InstructionKind) -> Callable[..., Any]:
    def perseus_instruction(engine: Any, buffer_id: int, **kwargs: Any) -> Any:
        tracked = handle.tracked
        if tracked is None:  # eval_batch / InferenceSchedule, or a schedule run outside train_batch
            return original(engine, buffer_id=buffer_id, **kwargs)
        microbatch = tracked.microbatch(kind, buffer_id)
        handle.listener.on_instruction_begin(kind, microbatch, 0)
        result = original(engine, buffer_id=buffer_id, **kwargs)
        handle.listener.on_instruction_end(kind, microbatch, 0)
        return result

    perseus_instruction.__name__ = f"perseus_{original.__name__}"
    perseus_instruction.__wrapped__ = original  # type: ignore[attr-defined]  # typeshed: no __wrapped__ on functions
    return perseus_instruction


def install_hooks(engine: Any, listener: InstructionListener) -> HookHandle:
    """Make ``engine`` report its training instructions to ``listener``; returns the handle to undo it.

    Only this engine changes. Raises ``UnsupportedDeepSpeedFeature`` for non-pipeline or DualPipeV
    engines and ``DeepSpeedVersionError`` when a hook point is missing in the installed DeepSpeed.
    """
    engine_module, schedule_module = load_pipe_modules()
    check_engine(engine, engine_module)
    if installed_handle(engine) is not None:
        raise HooksAlreadyInstalled(
            "Perseus hooks are already installed on this engine; call uninstall() on the existing handle first"
        )
    if not isinstance(listener, InstructionListener):
        raise PerseusError(
            f"listener {type(listener).__name__} lacks on_step_begin/on_step_end/on_instruction_begin/on_instruction_end"
        )
    if getattr(type(engine), "PERSEUS_SOURCE_HOOKS", 0) >= 1:
        return _install_source_hooks(engine, listener)
    return _install_runtime_hooks(engine, listener, schedule_module)


class _CountingListener:
    """What a patched engine calls: forwards to the user's listener, counts completed steps."""

    def __init__(self, handle: HookHandle) -> None:
        self.handle = handle

    def on_step_begin(self) -> None:
        self.handle.listener.on_step_begin()

    def on_step_end(self) -> None:
        self.handle.listener.on_step_end()
        self.handle.steps += 1

    def on_instruction_begin(self, kind: InstructionKind, microbatch: int, chunk: int = 0) -> None:
        self.handle.listener.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind: InstructionKind, microbatch: int, chunk: int = 0) -> None:
        self.handle.listener.on_instruction_end(kind, microbatch, chunk)


def _install_source_hooks(engine: Any, listener: InstructionListener) -> HookHandle:
    """Engine patched with patches/deepspeed-pipe-engine.patch: its own hook calls need only a listener."""
    handle = HookHandle(engine, listener, {_SOURCE_LISTENER: engine.__dict__.get(_SOURCE_LISTENER, _MISSING)})
    handle.source_hooks = True
    engine.__dict__[_SOURCE_LISTENER] = _CountingListener(handle)
    engine.__dict__[_HANDLE_ATTRIBUTE] = handle
    return handle


def _install_runtime_hooks(engine: Any, listener: InstructionListener, schedule_module: Any) -> HookHandle:
    """Unpatched engine: per-instance instruction map, step-tracking ``_exec_schedule``, ``train_batch``."""
    train_schedule_cls = schedule_module.TrainSchedule
    saved = {name: engine.__dict__.get(name, _MISSING) for name in _PATCHED}
    handle = HookHandle(engine, listener, saved)

    # The map lookup goes through the instance first, so a per-instance copy hooks this engine only.
    instruction_map = dict(engine._INSTRUCTION_MAP)
    hooked: tuple[tuple[Any, InstructionKind], ...] = ((schedule_module.ForwardPass, "forward"),
                                                       (schedule_module.BackwardPass, "backward"))
    for cls, kind in hooked:
        instruction_map[cls] = _instruction_wrapper(handle, instruction_map[cls], kind)

    exec_schedule = engine._exec_schedule  # bound: the class's (or an earlier instance override)
    train_batch = engine.train_batch

    def perseus_exec_schedule(self: Any, pipe_schedule: Any) -> Any:
        if not handle.in_train_batch:
            return exec_schedule(pipe_schedule)
        if not isinstance(pipe_schedule, train_schedule_cls):
            raise UnsupportedDeepSpeedFeature(
                f"train_batch ran a {type(pipe_schedule).__name__}; Perseus plans DeepSpeed's TrainSchedule only "
                "(remove the custom _train_schedule or disable Perseus)"
            )
        handle.tracked = TrackedTrainSchedule(pipe_schedule)
        try:
            return exec_schedule(handle.tracked)
        finally:
            handle.tracked = None

    def perseus_train_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if handle.in_train_batch:  # re-entrant call: let the outer one report
            return train_batch(*args, **kwargs)
        handle.in_train_batch = True
        try:
            handle.listener.on_step_begin()
            result = train_batch(*args, **kwargs)
        finally:
            handle.in_train_batch = False
        handle.listener.on_step_end()
        handle.steps += 1
        return result

    engine.__dict__["_INSTRUCTION_MAP"] = instruction_map
    engine.__dict__["_exec_schedule"] = MethodType(perseus_exec_schedule, engine)
    engine.__dict__["train_batch"] = MethodType(perseus_train_batch, engine)
    engine.__dict__[_HANDLE_ATTRIBUTE] = handle
    return handle
