"""Install Perseus hooks into megatron-core's pipeline schedules without forking Megatron.

megatron-core's schedules call ``forward_step`` and ``backward_step`` (and
``get_forward_backward_func`` returns the schedule functions) through module globals looked up
at call time, so replacing those module attributes hooks every training iteration. The same
wrappers serve ``python -m perseus_megatron.patch`` (and ``patches/``), which applies them as
decorators in the source instead; :func:`install_hooks` then only activates them.

This module imports neither torch nor Megatron at import time, because the patched
``schedules.py`` imports it while megatron-core itself is still importing.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable, TypeVar, cast

from perseus.errors import PerseusError
from perseus.runtime import HooksAlreadyInstalled, InstructionListener, stage_fingerprint
from perseus_megatron.tracker import ListenerForStep, ScheduleTracker, StepInfo

# a hooked function: each wrapper returns ``functools.wraps``' copy of it, cast back to its type
F = TypeVar("F", bound=Callable[..., Any])

_HOOK_ATTRIBUTE = "__perseus_hook__"
_lock = threading.Lock()
_active: ScheduleTracker | None = None
_active_handle: HookHandle | None = None
_combined_problem: str | None = "the hooks are not installed"  # why combined 1F1B is not hooked; None: it is



def _model_config(model: Any) -> Any:
    from megatron.core.utils import get_model_config

    first = model[0] if isinstance(model, (list, tuple)) else model
    return get_model_config(first)


def _step_info(schedule: str, kwargs: dict[str, Any], runs_combined: bool = True) -> StepInfo:
    """The step's shape; ``runs_combined``: the schedule function runs megatron-core's combined 1F1B
    when ``overlap_moe_expert_parallel_comm`` is on (``compat.COMBINED_SCHEDULE_FUNCTIONS``)."""
    from perseus_megatron.compat import check_call_supported, check_step_supported

    model = kwargs.get("model")
    forward_only = bool(kwargs.get("forward_only", False))
    if not forward_only:
        check_call_supported(kwargs)
    config = _model_config(model)
    check_step_supported(config, forward_only, _combined_problem)
    interleaved = schedule == "interleaved"
    if runs_combined and getattr(config, "overlap_moe_expert_parallel_comm", False):
        schedule = "megatron-combined-1f1b"
    chunks = len(model) if interleaved and isinstance(model, (list, tuple)) else 1
    group = getattr(config, "microbatch_group_size_per_vp_stage", None) if interleaved else None
    # Only the interleaved schedules read overlap_p2p_comm; 1F1B's exchanges ignore it.
    overlap = interleaved and bool(getattr(config, "overlap_p2p_comm", False))
    return StepInfo(
        schedule,
        int(kwargs["num_microbatches"]),
        chunks,
        group,
        forward_only,
        overlap_p2p=overlap,
        seq_length=kwargs.get("seq_length"),
        micro_batch_size=kwargs.get("micro_batch_size"),
        model_config=config,
        stage_fingerprint=_stage_fingerprint(model),
    )


def _stage_fingerprint(model: Any) -> str:
    """This rank's model chunks' parameters, for the cache key (memoized per chunk: every step asks)."""
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    chunks = [c for c in chunks if callable(getattr(c, "named_parameters", None))]
    return stage_fingerprint(chunks) if chunks else ""


def _schedule_wrapper(fn: F, point: str) -> F:
    from perseus_megatron.compat import COMBINED_SCHEDULE_FUNCTIONS, SCHEDULE_FUNCTIONS

    schedule, runs_combined = SCHEDULE_FUNCTIONS[point], point in COMBINED_SCHEDULE_FUNCTIONS

    @functools.wraps(fn)
    def perseus_schedule(*args: Any, **kwargs: Any) -> Any:
        tracker = _active
        if tracker is None:
            return fn(*args, **kwargs)
        info = _step_info(schedule, kwargs, runs_combined)
        with tracker.step(info):
            return fn(*args, **kwargs)

    return cast(F, perseus_schedule)


def _forward_wrapper(fn: F) -> F:
    @functools.wraps(fn)
    def perseus_forward_step(*args: Any, **kwargs: Any) -> Any:
        tracker = _active
        if tracker is None or not tracker.reporting:
            if tracker is not None:
                tracker.note_unreported_call()
            return fn(*args, **kwargs)
        return tracker.forward(
            kwargs.get("current_microbatch"), kwargs.get("vp_stage"), lambda: fn(*args, **kwargs)
        )

    return cast(F, perseus_forward_step)


def _backward_wrapper(fn: F) -> F:
    @functools.wraps(fn)
    def perseus_backward_step(*args: Any, **kwargs: Any) -> Any:
        tracker = _active
        if tracker is None or not tracker.reporting:
            return fn(*args, **kwargs)
        output = args[1] if len(args) > 1 else kwargs["output_tensor"]
        return tracker.backward(output, lambda: fn(*args, **kwargs))

    return cast(F, perseus_backward_step)


def _combined_wrapper(fn: F) -> F:
    from perseus_megatron.compat import COMBINED_POSITIONAL

    f_at, b_at, out_at = (COMBINED_POSITIONAL[name] for name in ("f_model", "b_model", "b_output_tensor"))

    @functools.wraps(fn)
    def perseus_combined_step(*args: Any, **kwargs: Any) -> Any:
        tracker = _active
        if tracker is None or not tracker.reporting:
            return fn(*args, **kwargs)
        f_model = args[f_at] if len(args) > f_at else kwargs.get("f_model")
        b_model = args[b_at] if len(args) > b_at else kwargs.get("b_model")
        output = args[out_at] if len(args) > out_at else kwargs.get("b_output_tensor")
        forward = (kwargs.get("current_microbatch"), kwargs.get("f_model_chunk_id")) if f_model is not None else None
        return tracker.combined(forward, output if b_model is not None else None, lambda: fn(*args, **kwargs))

    return cast(F, perseus_combined_step)


def wrap(point: str, fn: F) -> F:
    """The Perseus wrapper for one hook point; inert until :func:`install_hooks` activates it."""
    if point == "forward_step":
        wrapped = _forward_wrapper(fn)
    elif point == "combined_forward_backward_step":
        wrapped = _combined_wrapper(fn)
    elif point == "backward_step":
        wrapped = _backward_wrapper(fn)
    else:
        wrapped = _schedule_wrapper(fn, point)
    setattr(wrapped, _HOOK_ATTRIBUTE, point)
    return wrapped


def hook(point: str) -> Callable[[F], F]:
    """Decorator form of :func:`wrap`, which ``python -m perseus_megatron.patch`` puts in ``schedules.py``."""
    return functools.partial(wrap, point)


def is_hooked(fn: Any, point: str) -> bool:
    return getattr(fn, _HOOK_ATTRIBUTE, None) == point


class HookHandle:
    """An installed set of hooks; :meth:`uninstall` (or leaving the ``with`` block) restores Megatron."""

    def __init__(self, schedules: Any, replaced: dict[str, Any], tracker: ScheduleTracker,
                 combined: tuple[Any, Any] | None = None):
        self._schedules = schedules
        self._replaced = replaced  # point -> original function (empty for a patched schedules.py)
        self._combined = combined  # (combined_1f1b module, its original combined_forward_backward_step)
        self.tracker = tracker
        self.installed = True

    @property
    def patched_source(self) -> bool:
        """True when the schedules module carries the source patch and nothing was replaced."""
        return not self._replaced

    def uninstall(self) -> None:
        """Deactivate and restore the original functions; safe to call more than once."""
        global _active, _active_handle
        with _lock:
            if not self.installed:
                return
            self.installed = False
            for point, original in self._replaced.items():
                current = getattr(self._schedules, point)
                if is_hooked(current, point) and getattr(current, "__wrapped__", None) is original:
                    setattr(self._schedules, point, original)
                else:
                    warnings.warn(
                        f"megatron schedules.{point} was replaced by someone else after Perseus hooked it; "
                        "leaving it as is",
                        stacklevel=2,
                    )
            if self._combined is not None:
                module, original = self._combined
                if getattr(module.combined_forward_backward_step, "__wrapped__", None) is original:
                    module.combined_forward_backward_step = original
            if _active_handle is self:
                _active, _active_handle = None, None

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def _every_step(listener: InstructionListener) -> ListenerForStep:
    """``listener_for_step`` for a fixed listener: the same one at every step."""

    def for_step(info: StepInfo) -> InstructionListener:
        return listener

    return for_step


def install_hooks(
    listener: InstructionListener | None = None, *, listener_for_step: ListenerForStep | None = None
) -> HookHandle:
    """Report every training forward/backward of megatron-core's pipeline schedules to a listener.

    Give either a fixed ``listener`` or ``listener_for_step(info)``, called at each training
    step's beginning with the schedule, microbatch count and chunk count (how :func:`enable`
    creates the runtime once the job's shape is known). Raises ``HooksAlreadyInstalled`` if
    hooks are active, and ``MegatronVersionError`` if megatron-core lacks a hook point.
    """
    global _active, _active_handle, _combined_problem
    from perseus_megatron.compat import COMBINED_STEP, HOOK_POINTS, load_combined_module, load_schedules_module

    if listener is not None and listener_for_step is None:
        if not isinstance(listener, InstructionListener):
            raise PerseusError(
                f"install_hooks: {type(listener).__name__} is not an InstructionListener "
                "(needs on_step_begin, on_step_end, on_instruction_begin, on_instruction_end)"
            )
        for_step = _every_step(listener)
    elif listener is None and listener_for_step is not None:
        for_step = listener_for_step
    else:
        raise PerseusError("install_hooks needs exactly one of listener= or listener_for_step=")
    schedules = load_schedules_module()
    with _lock:
        if _active is not None:
            raise HooksAlreadyInstalled(
                "Perseus Megatron hooks are already installed in this process; call uninstall() "
                "(or close()) on the existing handle before installing again"
            )
        replaced: dict[str, Any] = {}
        for point in HOOK_POINTS:
            current = getattr(schedules, point)
            if not is_hooked(current, point):
                replaced[point] = current
        if replaced and len(replaced) != len(HOOK_POINTS):
            raise PerseusError(
                "megatron schedules.py is only partly patched for Perseus (hooked: "
                f"{', '.join(p for p in HOOK_POINTS if p not in replaced)}); run python -m perseus_megatron.patch "
                "--revert on the checkout, then patch it again"
            )
        for point, original in replaced.items():
            setattr(schedules, point, wrap(point, original))
        combined_module, _combined_problem = load_combined_module()
        combined = None
        if _combined_problem is None:  # not in the source patch: always hooked here
            original = getattr(combined_module, COMBINED_STEP)
            setattr(combined_module, COMBINED_STEP, wrap(COMBINED_STEP, original))
            combined = (combined_module, original)
        tracker = ScheduleTracker(for_step)
        handle = HookHandle(schedules, replaced, tracker, combined)
        _active, _active_handle = tracker, handle
    return handle


def active_handle() -> HookHandle | None:
    """The installed hook handle of this process, if any."""
    return _active_handle
