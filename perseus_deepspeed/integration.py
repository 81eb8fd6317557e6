"""``perseus_deepspeed.initialize``: ``deepspeed.initialize`` plus Perseus, for pipeline models.

The runtime needs the job's shape (stage, pipeline size, microbatches, data/tensor-parallel
position) and its settings; DeepSpeed has both once the ``PipelineEngine`` exists, so Perseus
starts right after ``deepspeed.initialize`` on every rank, reading the ``"perseus"`` section of
the same DeepSpeed config.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Mapping

from perseus import versions
from perseus.errors import ConfigError
from perseus.runtime import Attachment, InstructionListener, PerseusConfig, PipelineJob, entry_point_hooks
from perseus_deepspeed.compat import check_engine, load_pipe_modules
from perseus_deepspeed.hooks import install_hooks
from perseus_deepspeed.job import SECTION, job_from_engine, perseus_section, raw_config
from perseus_deepspeed.observability import MonitorSink, monitor_enabled

log = logging.getLogger("perseus.deepspeed")

ListenerWrapper = Callable[[InstructionListener], InstructionListener]
RuntimeFactory = Callable[..., Any]

_HANDLE_ATTRIBUTE = "_perseus"
_MISSING = object()


class DeepSpeedPerseus(Attachment):
    """Perseus attached to one ``PipelineEngine``: the runtime, the hooks that drive it, and shutdown."""

    def __init__(self, engine: Any, job: PipelineJob, config: PerseusConfig, runtime: Any) -> None:
        super().__init__(config, job, runtime)
        self._engine_ref = weakref.ref(engine)

    def _close_with_engine(self, engine: Any) -> None:
        """``engine.destroy()`` closes Perseus first (clocks back to default), then DeepSpeed's own;
        closing Perseus takes that wrapper and the engine's handle attribute away again."""
        saved = engine.__dict__.get("destroy", _MISSING)
        original = engine.destroy
        handle = weakref.ref(self)

        def destroy(*args: Any, **kwargs: Any) -> Any:
            me = handle()
            if me is not None:
                me.close()
            return original(*args, **kwargs)

        engine.__dict__["destroy"] = destroy
        engine.__dict__[_HANDLE_ATTRIBUTE] = self
        self.on_close(self._detach_from_engine(saved))

    def _detach_from_engine(self, saved_destroy: Any) -> Callable[[], None]:
        def detach() -> None:
            engine = self._engine_ref()
            if engine is None:
                return
            if saved_destroy is _MISSING:
                engine.__dict__.pop("destroy", None)
            else:
                engine.__dict__["destroy"] = saved_destroy
            if engine.__dict__.get(_HANDLE_ATTRIBUTE) is self:
                del engine.__dict__[_HANDLE_ATTRIBUTE]

        return detach


def get_handle(engine: Any) -> DeepSpeedPerseus | None:
    """The Perseus handle :func:`initialize` attached to ``engine`` (``None`` when Perseus is off)."""
    return engine.__dict__.get(_HANDLE_ATTRIBUTE)


def resolve_config(engine: Any, perseus: PerseusConfig | Mapping[str, Any] | None) -> PerseusConfig:
    """``perseus=`` argument if given (mapping entries override the section), else the config's section."""
    if perseus is None:
        return perseus_section(engine)
    if isinstance(perseus, PerseusConfig):
        return perseus
    if isinstance(perseus, Mapping):
        perseus_section(engine)  # a malformed section is an error even when overridden
        section = raw_config(engine).get(SECTION) or {}
        return PerseusConfig.from_dict({**dict(section), **dict(perseus)})
    raise ConfigError(f"perseus_deepspeed.initialize: perseus= must be a PerseusConfig or a mapping, got {type(perseus).__name__}")


def _default_runtime_factory() -> RuntimeFactory:
    from perseus.runtime import PerseusRuntime

    return PerseusRuntime


def attach(
    engine: Any,
    config: PerseusConfig,
    *,
    process_group: Any = None,
    model_config: Mapping[str, Any] | None = None,
    listener_wrapper: ListenerWrapper | None = None,
    runtime_factory: RuntimeFactory | None = None,
) -> DeepSpeedPerseus:
    """Create the runtime for an existing ``PipelineEngine`` and hook it; call on every rank."""
    engine_module, _ = load_pipe_modules()
    check_engine(engine, engine_module)
    entry_point_hooks(config)
    versions.warn_unsupported(versions.DEEPSPEED, ("torch",))  # deepspeed: compat, with the hook points
    job = job_from_engine(engine, model_config)
    factory = runtime_factory or _default_runtime_factory()
    runtime = factory(job, config, process_group=process_group)
    handle = DeepSpeedPerseus(engine, job, config, runtime)
    try:
        listener = listener_wrapper(runtime) if listener_wrapper is not None else runtime
        handle.hooks = install_hooks(engine, listener)
        handle.on_close(handle.hooks.uninstall)
        handle._close_with_engine(engine)
        add_sink = getattr(runtime, "add_metrics_sink", None)
        if callable(add_sink) and monitor_enabled(engine):  # whatever monitors the DeepSpeed config enables
            add_sink(MonitorSink(engine))
    except BaseException:
        handle.close()
        raise
    handle.close_at_exit()
    return handle


def initialize(
    *args: Any,
    perseus: PerseusConfig | Mapping[str, Any] | None = None,
    process_group: Any = None,
    model_config: Mapping[str, Any] | None = None,
    listener_wrapper: ListenerWrapper | None = None,
    runtime_factory: RuntimeFactory | None = None,
    **kwargs: Any,
) -> tuple[Any, ...]:
    """Drop-in for ``deepspeed.initialize`` that also starts Perseus on pipeline engines.

    Returns exactly what ``deepspeed.initialize`` returns. Perseus is configured by the
    ``"perseus"`` section of the DeepSpeed config (or ``perseus=``); without either it stays off
    and the engine is returned untouched. With Perseus on, the engine must be a
    ``PipelineEngine`` (a ``PipelineModule`` model), otherwise ``UnsupportedDeepSpeedFeature``.
    ``get_handle(engine)`` gives the runtime and its ``summary()``; ``engine.destroy()`` or
    interpreter exit restores default clocks. ``model_config`` adds fingerprint entries (e.g.
    sequence length) to the runtime's cache key.
    """
    import deepspeed

    result = deepspeed.initialize(*args, **kwargs)
    engine = result[0]
    config = resolve_config(engine, perseus)
    if not config.enabled:
        log.info("perseus: no enabled \"perseus\" section in the DeepSpeed config; training runs unchanged")
        return result
    attach(
        engine, config, process_group=process_group, model_config=model_config,
        listener_wrapper=listener_wrapper, runtime_factory=runtime_factory,
    )
    return result
