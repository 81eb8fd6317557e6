"""``patches/deepspeed-pipe-engine.patch`` applies cleanly to the installed DeepSpeed and drives the same listener.

The installed ``deepspeed/runtime/pipe/engine.py`` is copied to a temporary directory and
patched with ``patch -p1`` (no offset, no fuzz). The patched module is then imported inside the
``deepspeed.runtime.pipe`` package under another name and its engine trains for real: with a
listener set by ``install_hooks`` it reports the schedule order; before and after, nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

import deepspeed.runtime.pipe.engine as installed_engine

from perseus.runtime.job import RecordingListener
from perseus.schedules import build_schedule
from perseus_deepspeed.hooks import install_hooks, installed_handle
from perseus_demo.tiny_pipe import (
    TinyPipeShape,
    build_pipeline,
    client_optimizer,
    data_iterator,
    deepspeed_config,
)

PATCH = Path(__file__).resolve().parents[2] / "patches" / "deepspeed-pipe-engine.patch"
TARGET = Path("deepspeed/runtime/pipe/engine.py")
SHAPE = TinyPipeShape(hidden_size=8, layers_per_stage=1, micro_batch_size=2)
MICROBATCHES = 3


def patched_copy(tmp_path: Path) -> Path:
    target = tmp_path / TARGET
    target.parent.mkdir(parents=True)
    shutil.copy(installed_engine.__file__, target)
    return target


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch program")
def test_patch_applies_cleanly_to_the_installed_engine(tmp_path):
    target = patched_copy(tmp_path)
    dry = subprocess.run(["patch", "-p1", "--dry-run", "-i", str(PATCH)], cwd=tmp_path, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "offset" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout
    applied = subprocess.run(["patch", "-p1", "-i", str(PATCH)], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout
    assert "PERSEUS_SOURCE_HOOKS = 1" in target.read_text()
    if shutil.which("git"):
        fresh = tmp_path / "fresh"
        patched_copy(fresh)
        check = subprocess.run(["git", "apply", "--check", str(PATCH)], cwd=fresh, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


@pytest.fixture
def patched_engine_class(tmp_path, monkeypatch):
    if shutil.which("patch") is None:
        pytest.skip("needs the patch program")
    target = patched_copy(tmp_path)
    subprocess.run(["patch", "-p1", "-i", str(PATCH)], cwd=tmp_path, check=True, capture_output=True)
    name = "deepspeed.runtime.pipe.perseus_patched_engine"  # relative imports resolve in the real package
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(deepspeed, "PipelineEngine", module.PipelineEngine)  # what deepspeed.initialize builds
    monkeypatch.setattr(installed_engine, "PipelineEngine", module.PipelineEngine)
    return module.PipelineEngine


def test_patched_engine_reports_through_the_same_listener(dist_world, patched_engine_class):
    model = build_pipeline(1, SHAPE)
    engine, *_ = deepspeed.initialize(model=model, optimizer=client_optimizer(model),
                                      config=deepspeed_config(MICROBATCHES, SHAPE))
    assert type(engine) is patched_engine_class
    data = data_iterator(SHAPE)
    engine.train_batch(data)  # no listener: the patched engine trains unchanged
    recorder = RecordingListener()
    handle = install_hooks(engine, recorder)
    assert handle.source_hooks and "_INSTRUCTION_MAP" not in engine.__dict__
    engine.train_batch(data)
    engine.eval_batch(data_iterator(SHAPE, seed=1))
    engine.train_batch(data)
    want = list(build_schedule("1f1b", 1, MICROBATCHES).stages[0])
    assert recorder.steps == [want, want] and handle.steps == 2
    handle.uninstall()
    assert "_perseus_listener" not in engine.__dict__ and installed_handle(engine) is None
    engine.train_batch(data)
    assert len(recorder.steps) == 2
