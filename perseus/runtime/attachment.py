"""Perseus attached to one training job: its runtime, what an adapter installed, one shutdown.

Every adapter (Megatron, DeepSpeed, torch pipelining) hands its user one of these, so the surface
is the same everywhere (``runtime``, ``job``, ``hooks``, ``summary()``, ``close()``, a context
manager) and shutdown is written once: undo what the adapter installed, newest first, then close
the runtime, which puts the clocks back to default; exactly once, also at interpreter exit.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable

from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.lifecycle import install_process_hooks

Undo = Callable[[], None]


class Attachment:
    """The runtime an adapter created and the undo steps of what it installed around it."""

    def __init__(self, config: PerseusConfig, job: PipelineJob | None = None, runtime: Any = None) -> None:
        self.config = config
        self.job = job
        self.runtime = runtime
        self.hooks: Any = None  # the framework hook handle, for inspection (what got patched)
        self._undo: list[Undo] = []
        self._closed = False

    def on_close(self, undo: Undo) -> None:
        """Run ``undo`` at ``close()``, before the steps registered earlier and before the runtime closes."""
        self._undo.append(undo)

    def summary(self) -> dict[str, Any]:
        """The runtime's measured results: baseline and current iteration time and energy, phases
        (empty before the runtime exists)."""
        return self.runtime.summary() if self.runtime is not None else {}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Undo the installed hooks and patches, then close the runtime (default clocks); idempotent.

        Every step runs even if an earlier one raises; the first error is raised at the end.
        """
        if self._closed:
            return
        self._closed = True
        error: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as exc:  # noqa: BLE001 - the runtime must still close
                error = error or exc
        try:
            if self.runtime is not None:
                self.runtime.close()
        finally:
            if error is not None:
                raise error

    def close_at_exit(self) -> None:
        """Close at interpreter exit unless closed (or garbage-collected) before; nothing when the
        config leaves the process's hooks to the trainer (``process_hooks`` off)."""
        if self.config.process_hooks:
            atexit.register(_close_if_alive, weakref.ref(self))

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def entry_point_hooks(config: PerseusConfig) -> None:
    """What an adapter's entry point calls first, before it starts a runtime: the process's hooks
    (``install_process_hooks``) when Perseus is on and the config does not leave them to the trainer."""
    if config.enabled and config.process_hooks:
        install_process_hooks()


def _close_if_alive(ref: weakref.ref) -> None:
    attachment = ref()
    if attachment is not None:
        attachment.close()
