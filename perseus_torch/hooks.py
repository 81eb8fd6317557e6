"""Install Perseus hooks on one torch.distributed.pipelining schedule instance and its stages.

Hooks are instance attributes that shadow the class methods: ``step`` and ``eval`` of the
schedule (``eval`` calls ``step``; the tracker keeps it unreported) and the three compute methods
of each stage. Nothing in torch is modified at module or class level, so other schedules in the
process are untouched, and :meth:`HookHandle.uninstall` deletes the attributes again. (The
schedule's ``register_custom_function`` would replace an action rather than observe it, so it is
not used.)
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

from perseus.errors import PerseusError
from perseus.runtime import HooksAlreadyInstalled, InstructionListener
from perseus.schedules import InstructionKind
from perseus_torch.compat import (
    HOOK_METHODS,
    UnsupportedTorchSchedule,
    check_stage,
    chunk_map,
    fused_units,
    schedule_name,
    schedule_stages,
)
from perseus_torch.tracker import PipelineTracker

_MARK = "__perseus_torch_hook__"
_HANDLE = "_perseus_torch_hooks"



def _kind(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InstructionKind:
    if method == "forward_one_chunk":
        return "forward"
    if method == "backward_weight_one_chunk":
        return "backward_weight"
    full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
    return "backward" if full else "backward_input"


def _microbatch(args: tuple[Any, ...], kwargs: dict[str, Any], method: str) -> Any:
    if args:
        return args[0]
    return kwargs.get("bwd_chunk_id" if method.startswith("backward") else "fwd_chunk_id")


class HookHandle:
    """Installed hooks on one schedule; :meth:`uninstall` (or leaving ``with``) removes them."""

    def __init__(self, schedule: Any, stages: list[Any], tracker: PipelineTracker, name: str) -> None:
        self.schedule, self.stages, self.tracker, self.schedule_name = schedule, stages, tracker, name
        self.chunks = chunk_map(stages)
        self.installed = False
        self._owned: list[tuple[Any, str]] = []

    def _shadow(self, obj: Any, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(obj, attr)
        wrapper = make(original)
        setattr(wrapper, _MARK, True)
        obj.__dict__[attr] = wrapper
        self._owned.append((obj, attr))

    def _install(self) -> None:
        tracker = self.tracker
        schedule = self.schedule

        def step_hook(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def step(*args: Any, **kwargs: Any) -> Any:
                with tracker.step(bool(getattr(schedule, "_has_backward", True))):
                    return original(*args, **kwargs)

            return step

        def eval_hook(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def evaluate(*args: Any, **kwargs: Any) -> Any:
                with tracker.evaluation():
                    return original(*args, **kwargs)

            return evaluate

        def compute_hook(method: str, chunk: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
            def make(original: Callable[..., Any]) -> Callable[..., Any]:
                @functools.wraps(original)
                def compute(*args: Any, **kwargs: Any) -> Any:
                    if not tracker.reporting:
                        return original(*args, **kwargs)
                    return tracker.compute(_kind(method, args, kwargs), _microbatch(args, kwargs, method), chunk,
                                           lambda: original(*args, **kwargs))

                return compute

            return make

        self._shadow(schedule, "step", step_hook)
        if hasattr(schedule, "eval"):
            self._shadow(schedule, "eval", eval_hook)
        for stage in self.stages:
            for method in HOOK_METHODS:
                self._shadow(stage, method, compute_hook(method, self.chunks[int(stage.stage_index)]))
        schedule.__dict__[_HANDLE] = self
        self.installed = True

    def uninstall(self) -> None:
        """Remove every hook this handle installed; safe to call more than once."""
        if not self.installed:
            return
        self.installed = False
        for obj, attr in reversed(self._owned):
            current = obj.__dict__.get(attr)
            if current is not None and getattr(current, _MARK, False):
                del obj.__dict__[attr]
            else:
                warnings.warn(f"{type(obj).__name__}.{attr} was replaced after Perseus hooked it; leaving it as is",
                              stacklevel=2)
        self._owned.clear()
        if self.schedule.__dict__.get(_HANDLE) is self:
            del self.schedule.__dict__[_HANDLE]

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def resolve_stages(schedule: Any, stages: Any = None) -> list[Any]:
    """The schedule's stages on this rank; ``stages`` (one or a list), when given, must be them."""
    own = schedule_stages(schedule)
    if stages is None:
        given = own
    else:
        given = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        if own and {id(s) for s in given} != {id(s) for s in own}:
            raise UnsupportedTorchSchedule(
                "perseus_torch: the stages given are not the ones the schedule runs on this rank; pass the "
                "same stage objects the schedule was built with (or none)"
            )
    if not given:
        raise UnsupportedTorchSchedule("perseus_torch: the schedule has no stages on this rank")
    for stage in given:
        check_stage(stage)
    return given


def install_hooks(schedule: Any, listener: InstructionListener, stages: Any = None) -> HookHandle:
    """Report every training F/B/I/W of ``schedule.step()`` on this rank to ``listener``.

    Events carry the Perseus chunk (the stage's position among this rank's stages, ascending torch
    stage index) and the microbatch. Raises ``UnsupportedTorchSchedule`` for schedules Perseus
    cannot follow (CSV-loaded, unknown classes) and ``HooksAlreadyInstalled`` on a second install.
    DualPipeV's ``OVERLAP_F_B`` actions are reported as one fused ``forward_backward`` unit each,
    with the backward's microbatch and chunk (``backward=``).
    """
    if not isinstance(listener, InstructionListener):
        raise PerseusError(
            f"install_hooks: {type(listener).__name__} is not an InstructionListener "
            "(needs on_step_begin, on_step_end, on_instruction_begin, on_instruction_end)"
        )
    name = schedule_name(schedule)
    resolved = resolve_stages(schedule, stages)
    if schedule.__dict__.get(_HANDLE) is not None:
        raise HooksAlreadyInstalled("perseus_torch: this schedule already has Perseus hooks; uninstall them first")
    fused = fused_units(schedule, int(resolved[0].group_rank), chunk_map(resolved))
    handle = HookHandle(schedule, resolved, PipelineTracker(listener, fused), name)
    try:
        handle._install()
    except BaseException:
        handle.installed = True
        handle.uninstall()
        raise
    return handle


def installed_handle(schedule: Any) -> HookHandle | None:
    return schedule.__dict__.get(_HANDLE)
