"""Real megatron-core training steps in this process (one rank, gloo, CPU): hooks and the source patch.

With one pipeline stage megatron-core runs ``forward_backward_no_pipelining``, whose order is the
one-stage 1F1B order. The source-patch test applies the installed release's
``patches/megatron-core-<major.minor>-schedules.patch`` (0.16 on Python 3.11, 0.19 on the 3.12 line) to
a copy of the installed ``schedules.py`` and drives a training step through the patched module.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from megatron.core import pipeline_parallel
from megatron.core.pipeline_parallel import schedules

from perseus.runtime.job import RecordingListener
from perseus.schedules import build_schedule
from perseus_demo.megatron_cpu import cpu_execution
from perseus_megatron import hooks
from perseus_megatron.hooks import install_hooks
from megatron_fixtures import trainer, no_leftover_hooks  # noqa: F401 - pytest fixtures, found by their names

REPO = Path(__file__).resolve().parents[2]


def _installed_release() -> str:
    from importlib.metadata import version

    return ".".join(version("megatron-core").split(".")[:2])


PATCH = REPO / "patches" / f"megatron-core-{_installed_release()}-schedules.patch"
MICROBATCHES = 3


def _orders(recorder: RecordingListener) -> list[list[tuple[str, int, int]]]:
    return [[(i.kind, i.microbatch, i.chunk) for i in step] for step in recorder.steps]


def _expected(num_microbatches: int) -> list[tuple[str, int, int]]:
    return [(i.kind, i.microbatch, i.chunk) for i in build_schedule("1f1b", 1, num_microbatches).stages[0]]


def test_hooked_training_steps_report_the_schedule_order_and_eval_reports_nothing(trainer):
    recorder = RecordingListener()
    with cpu_execution(), install_hooks(recorder):
        trainer.step(MICROBATCHES)
        trainer.step(MICROBATCHES, forward_only=True)
        trainer.step(MICROBATCHES + 1)
    assert _orders(recorder) == [_expected(MICROBATCHES), _expected(MICROBATCHES + 1)]


def test_uninstalled_hooks_report_nothing(trainer):
    recorder = RecordingListener()
    handle = install_hooks(recorder)
    handle.uninstall()
    with cpu_execution():
        trainer.step(MICROBATCHES)
    assert recorder.steps == []


def test_schedule_fetched_before_install_is_flagged(trainer, monkeypatch, caplog):
    stale = pipeline_parallel.get_forward_backward_func()  # the unhooked function
    monkeypatch.setattr(pipeline_parallel, "get_forward_backward_func", lambda: stale)
    recorder = RecordingListener()
    with cpu_execution(), install_hooks(recorder), caplog.at_level(logging.WARNING):
        trainer.step(MICROBATCHES)
    assert recorder.steps == []
    assert any("after perseus_megatron.enable()" in r.message for r in caplog.records)


def _apply_patch(tmp_path: Path) -> Path:
    target = tmp_path / "megatron" / "core" / "pipeline_parallel" / "schedules.py"
    target.parent.mkdir(parents=True)
    shutil.copy(schedules.__file__, target)
    if not PATCH.is_file():
        pytest.skip(f"no schedules.py patch for the installed megatron-core {_installed_release()}")
    tool = shutil.which("patch")
    if tool is None:
        pytest.skip("the patch tool is not installed")
    result = subprocess.run([tool, "-p1", "--forward", "-i", str(PATCH)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "offset" not in result.stdout and "fuzz" not in result.stdout, result.stdout  # applies cleanly
    return target


def test_source_patch_applies_cleanly_and_drives_the_same_hooks(trainer, tmp_path, monkeypatch):
    patched_file = _apply_patch(tmp_path)
    name = "megatron.core.pipeline_parallel._perseus_patched_schedules"
    spec = importlib.util.spec_from_file_location(name, patched_file)
    assert spec is not None and spec.loader is not None
    patched = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, patched)
    spec.loader.exec_module(patched)
    for point in ("forward_step", "backward_step", "forward_backward_no_pipelining"):
        assert hooks.is_hooked(getattr(patched, point), point)

    # Make the patched module *the* schedules module, as it is after patching an installation.
    monkeypatch.setattr(pipeline_parallel, "schedules", patched)
    monkeypatch.setitem(sys.modules, "megatron.core.pipeline_parallel.schedules", patched)
    monkeypatch.setattr(pipeline_parallel, "get_forward_backward_func", patched.get_forward_backward_func)

    recorder = RecordingListener()
    before = patched.forward_step
    with cpu_execution():
        trainer.step(MICROBATCHES)  # inert before enabling
        with install_hooks(recorder) as handle:
            assert handle.patched_source and patched.forward_step is before  # nothing replaced
            trainer.step(MICROBATCHES)
        trainer.step(MICROBATCHES)  # inert again after uninstall
    assert _orders(recorder) == [_expected(MICROBATCHES)]
    assert patched.forward_step is before
