"""One shutdown for every adapter: undo steps newest first, then the runtime; once; even after an error."""

from __future__ import annotations

import gc

import pytest

from perseus.runtime import PerseusConfig
from perseus.runtime.attachment import Attachment, _close_if_alive


class FakeRuntime:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def summary(self) -> dict:
        return {"phase": "profiling"}

    def close(self) -> None:
        self.log.append("runtime")


def test_close_undoes_newest_first_then_closes_the_runtime_once():
    log: list[str] = []
    attachment = Attachment(PerseusConfig(), runtime=FakeRuntime(log))
    attachment.on_close(lambda: log.append("hooks"))
    attachment.on_close(lambda: log.append("iteration log"))
    with attachment as same:
        assert same is attachment and same.summary() == {"phase": "profiling"}
    attachment.close()
    assert log == ["iteration log", "hooks", "runtime"] and attachment.closed


def test_a_failing_undo_step_still_runs_the_others_and_closes_the_runtime():
    log: list[str] = []
    attachment = Attachment(PerseusConfig(), runtime=FakeRuntime(log))
    attachment.on_close(lambda: log.append("hooks"))

    def broken() -> None:
        raise RuntimeError("patch already gone")

    attachment.on_close(broken)
    with pytest.raises(RuntimeError, match="patch already gone"):
        attachment.close()
    assert log == ["hooks", "runtime"]


def test_without_a_runtime_summary_is_empty_and_close_works():
    attachment = Attachment(PerseusConfig())
    assert attachment.summary() == {}
    attachment.close()
    assert attachment.closed


def test_the_exit_hook_does_not_keep_a_dropped_attachment_alive():
    log: list[str] = []
    attachment = Attachment(PerseusConfig(), runtime=FakeRuntime(log))
    attachment.close_at_exit()
    import weakref

    ref = weakref.ref(attachment)
    del attachment
    gc.collect()
    assert ref() is None
    _close_if_alive(ref)  # what atexit runs: nothing left to close
    assert log == []
