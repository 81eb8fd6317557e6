"""Real DeepSpeed PipelineEngines in this process (one rank, gloo, CPU): install, report, remove.

One pipeline stage: TrainSchedule's one-stage order is the core's one-stage 1F1B order. Orders of
real multi-stage runs are checked in test_deepspeed_orders_distributed.py.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

import torch
from deepspeed.runtime.pipe import schedule as ds_schedule
from deepspeed.runtime.pipe.engine import PipelineEngine

import perseus.runtime
from perseus.runtime.job import RecordingListener
from perseus.schedules import build_schedule
from perseus_deepspeed import compat
from perseus_deepspeed.compat import DeepSpeedVersionError, UnsupportedDeepSpeedFeature
from perseus_demo.deepspeed_cpu import shm_comm_op_skipped
from perseus_deepspeed.hooks import HooksAlreadyInstalled, install_hooks, installed_handle
from perseus_demo.tiny_pipe import (
    TinyPipeShape,
    build_pipeline,
    client_optimizer,
    data_iterator,
    deepspeed_config,
)

MICROBATCHES = 3
SHAPE = TinyPipeShape(hidden_size=16, layers_per_stage=2, micro_batch_size=2)


def make_engine(microbatches: int = MICROBATCHES, checkpoint_interval: int = 0) -> PipelineEngine:
    model = build_pipeline(1, SHAPE, activation_checkpoint_interval=checkpoint_interval)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=client_optimizer(model), config=deepspeed_config(microbatches, SHAPE)
    )
    return engine


@pytest.fixture(scope="module")
def engine(dist_world):
    return make_engine()


@pytest.fixture(scope="module")
def other_engine(dist_world):
    return make_engine()


@pytest.fixture(autouse=True)
def _no_leftover_hooks(request):
    yield
    for name in ("engine", "other_engine"):
        if name in request.fixturenames:
            handle = installed_handle(request.getfixturevalue(name))
            if handle is not None:
                handle.uninstall()


def orders(recorder: RecordingListener) -> list[list[str]]:
    return [[i.short() for i in step] for step in recorder.steps]


def expected(microbatches: int = MICROBATCHES) -> list[str]:
    return [i.short() for i in build_schedule("1f1b", 1, microbatches).stages[0]]


def test_the_fixture_never_compiled_the_shm_op(dist_world):
    assert shm_comm_op_skipped()
    assert deepspeed.comm.comm.cdb.shm_comm_op is None


def test_train_steps_report_the_schedule_and_eval_reports_nothing(engine):
    recorder = RecordingListener()
    handle = install_hooks(engine, recorder)
    data = data_iterator(SHAPE)
    engine.train_batch(data)
    engine.eval_batch(data_iterator(SHAPE, seed=1))
    engine.train_batch(data)
    assert orders(recorder) == [expected(), expected()]
    assert handle.steps == 2
    handle.uninstall()
    engine.train_batch(data)
    assert len(recorder.steps) == 2


def test_step_events_wrap_the_instructions(engine):
    events: list[str] = []

    class Log:
        def on_step_begin(self):
            events.append("begin")

        def on_step_end(self):
            events.append("end")

        def on_instruction_begin(self, kind, microbatch, chunk=0):
            events.append(f"{kind[0]}{microbatch}")

        def on_instruction_end(self, kind, microbatch, chunk=0):
            events.append(f"/{kind[0]}{microbatch}")

    install_hooks(engine, Log())
    engine.train_batch(data_iterator(SHAPE))
    assert events[0] == "begin" and events[-1] == "end"
    assert events[1:-1] == [e for i in expected() for e in (f"{i[0].lower()}{i[1:]}", f"/{i[0].lower()}{i[1:]}")]


def test_uninstall_restores_the_engine_and_class_exactly(engine):
    class_map = dict(PipelineEngine._INSTRUCTION_MAP)
    before = {k: v for k, v in engine.__dict__.items() if k in ("_INSTRUCTION_MAP", "_exec_schedule", "train_batch")}
    handle = install_hooks(engine, RecordingListener())
    assert engine._INSTRUCTION_MAP is not PipelineEngine._INSTRUCTION_MAP
    assert PipelineEngine._INSTRUCTION_MAP == class_map  # the class map is never edited
    handle.uninstall()
    handle.uninstall()  # idempotent
    after = {k: v for k, v in engine.__dict__.items() if k in ("_INSTRUCTION_MAP", "_exec_schedule", "train_batch")}
    assert after == before == {}
    assert engine._INSTRUCTION_MAP is PipelineEngine._INSTRUCTION_MAP
    assert installed_handle(engine) is None


def test_other_engines_are_untouched(engine, other_engine):
    mine, theirs = RecordingListener(), RecordingListener()
    install_hooks(engine, mine)
    other_engine.train_batch(data_iterator(SHAPE))
    assert mine.steps == [] and installed_handle(other_engine) is None
    install_hooks(other_engine, theirs)
    engine.train_batch(data_iterator(SHAPE))
    assert orders(mine) == [expected()] and theirs.steps == []


def test_second_install_is_refused_and_reinstall_after_uninstall_works(engine):
    handle = install_hooks(engine, RecordingListener())
    with pytest.raises(HooksAlreadyInstalled, match="uninstall\\(\\)"):
        install_hooks(engine, RecordingListener())
    assert HooksAlreadyInstalled is perseus.runtime.HooksAlreadyInstalled, "one class for every adapter"
    handle.uninstall()
    recorder = RecordingListener()
    install_hooks(engine, recorder)
    engine.train_batch(data_iterator(SHAPE))
    assert orders(recorder) == [expected()]


def test_remove_is_a_deprecated_name_of_uninstall(engine):
    handle = install_hooks(engine, RecordingListener())
    with pytest.warns(DeprecationWarning, match="uninstall"):
        handle.remove()
    assert installed_handle(engine) is None and not handle.installed


def test_activation_checkpointing_keeps_the_order(dist_world):
    checkpointed = make_engine(microbatches=4, checkpoint_interval=1)
    recorder = RecordingListener()
    handle = install_hooks(checkpointed, recorder)
    checkpointed.train_batch(data_iterator(SHAPE))
    handle.uninstall()
    assert orders(recorder) == [expected(4)]


def test_a_custom_train_schedule_is_refused(engine, monkeypatch):
    install_hooks(engine, RecordingListener())
    monkeypatch.setattr(engine, "_train_schedule", lambda: ds_schedule.DataParallelSchedule(MICROBATCHES, 1, 0))
    with pytest.raises(UnsupportedDeepSpeedFeature, match="DataParallelSchedule.*TrainSchedule only"):
        engine.train_batch(data_iterator(SHAPE))


def test_a_listener_without_the_protocol_is_refused(engine):
    with pytest.raises(Exception, match="lacks on_step_begin"):
        install_hooks(engine, object())
    assert installed_handle(engine) is None


def test_non_pipeline_engine_is_refused(dist_world):
    model = torch.nn.Linear(4, 4)
    plain, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        config={"train_micro_batch_size_per_gpu": 1},
    )
    with pytest.raises(UnsupportedDeepSpeedFeature, match="not a DeepSpeed PipelineEngine.*PipelineModule"):
        install_hooks(plain, RecordingListener())


def test_missing_hook_point_names_version_and_what_is_missing(engine, monkeypatch):
    monkeypatch.delattr(ds_schedule.TrainSchedule, "_step_to_micro_batch")
    with pytest.raises(DeepSpeedVersionError, match=f"deepspeed {deepspeed.__version__} .*TrainSchedule._step_to_micro_batch"):
        install_hooks(engine, RecordingListener())
    assert installed_handle(engine) is None


def test_missing_instruction_map_entry_is_named(monkeypatch):
    monkeypatch.setattr(PipelineEngine, "_INSTRUCTION_MAP", {ds_schedule.ForwardPass: None})
    with pytest.raises(DeepSpeedVersionError, match="_INSTRUCTION_MAP entry for BackwardPass"):
        compat.load_pipe_modules()


def test_untested_version_warns(monkeypatch):
    monkeypatch.setattr(deepspeed, "__version__", "0.20.0")
    with pytest.warns(UserWarning, match="0.20.0 .*untested.*0.19.x"):
        compat.load_pipe_modules()


def test_missing_grid_method_is_named(engine, monkeypatch):
    monkeypatch.delattr(type(engine.grid), "get_slice_parallel_rank")
    with pytest.raises(DeepSpeedVersionError, match="lacks grid.get_slice_parallel_rank\\(\\)"):
        install_hooks(engine, RecordingListener())


def test_dualpipev_engines_are_refused():
    from deepspeed.runtime.pipe.dualpipev import DualPipeVEngine
    from deepspeed.runtime.pipe import engine as engine_module

    dualpipe = DualPipeVEngine.__new__(DualPipeVEngine)  # isinstance is all the check needs
    with pytest.raises(UnsupportedDeepSpeedFeature, match="DualPipeV .*plain PipelineModule"):
        compat.check_engine(dualpipe, engine_module)
