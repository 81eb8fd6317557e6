"""``perseus_deepspeed.initialize``: the "perseus" config section, the job, the runtime's lifetime.

Real DeepSpeed engines in this process (one rank, gloo, CPU). Most tests give a recording
runtime factory; one runs the real ``PerseusRuntime`` on a simulated GPU.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

import torch

from perseus.errors import ConfigError
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import RecordingListener
from perseus.schedules import build_schedule
from perseus_deepspeed import UnsupportedDeepSpeedFeature, get_handle, initialize, installed_handle
from perseus_demo.tiny_pipe import (
    TinyPipeShape,
    build_pipeline,
    client_optimizer,
    data_iterator,
    deepspeed_config,
)

SHAPE = TinyPipeShape(hidden_size=8, layers_per_stage=1, micro_batch_size=2)
MICROBATCHES = 2


class FakeRuntime(RecordingListener):
    """Stands in for PerseusRuntime: records the job, config and events it receives."""

    def __init__(self, job, config, *, process_group=None):
        super().__init__()
        self.job, self.config, self.closed = job, config, 0

    def summary(self):
        return {"steps": len(self.steps)}

    def close(self):
        self.closed += 1


def start(perseus_section=None, config=None, **kwargs):
    model = build_pipeline(1, SHAPE)
    config = config if config is not None else deepspeed_config(MICROBATCHES, SHAPE, perseus_section)
    return initialize(model=model, optimizer=client_optimizer(model), config=config, **kwargs)


def test_without_a_section_perseus_stays_off(dist_world):
    result = start(None, runtime_factory=FakeRuntime)
    assert isinstance(result, tuple) and len(result) == 4  # what deepspeed.initialize returns
    engine, optimizer, loader, scheduler = result
    assert optimizer is engine.optimizer and loader is None and scheduler is None
    assert get_handle(engine) is None and installed_handle(engine) is None


def test_section_configures_the_runtime_and_the_hooks_drive_it(dist_world):
    engine, *_ = start({"mode": "profile", "gpu": "sim", "warmup_steps": 3}, runtime_factory=FakeRuntime)
    handle = get_handle(engine)
    runtime = handle.runtime
    assert isinstance(runtime, FakeRuntime)
    assert runtime.config.mode == "profile" and runtime.config.warmup_steps == 3
    job = runtime.job
    assert (job.num_stages, job.num_microbatches, job.stage, job.dp_size, job.tp_size) == (1, MICROBATCHES, 0, 1, 1)
    assert job.model_config["micro_batch_size"] == SHAPE.micro_batch_size
    engine.train_batch(data_iterator(SHAPE))
    assert runtime.steps == [list(build_schedule("1f1b", 1, MICROBATCHES).stages[0])]
    assert handle.summary() == {"steps": 1}
    handle.close()


def test_perseus_argument_overrides_the_section(dist_world):
    engine, *_ = start({"mode": "profile", "warmup_steps": 3}, perseus={"warmup_steps": 5}, runtime_factory=FakeRuntime)
    config = get_handle(engine).runtime.config
    assert (config.mode, config.warmup_steps) == ("profile", 5)
    get_handle(engine).close()
    engine, *_ = start(None, perseus=PerseusConfig(mode="plan"), runtime_factory=FakeRuntime)
    assert get_handle(engine).runtime.config.mode == "plan"
    get_handle(engine).close()


def test_section_is_read_from_a_json_config_file(dist_world, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(deepspeed_config(MICROBATCHES, SHAPE, {"mode": "measure-only"})))
    engine, *_ = start(config=str(path), runtime_factory=FakeRuntime)
    assert get_handle(engine).runtime.config.mode == "measure-only"
    get_handle(engine).close()


def test_enabled_false_leaves_the_engine_alone(dist_world):
    engine, *_ = start({"enabled": False, "mode": "profile"}, runtime_factory=FakeRuntime)
    assert get_handle(engine) is None and installed_handle(engine) is None


@pytest.mark.parametrize(
    "section,message",
    [
        ({"mode": "fast"}, "mode: must be one of profile, plan, run, measure-only"),
        ({"warmup_step": 2}, "warmup_step: unknown setting"),
        ("on", '"perseus" section must be an object'),
    ],
)
def test_invalid_section_is_a_config_error_naming_the_field(dist_world, section, message):
    with pytest.raises(ConfigError, match=message):
        start(section, runtime_factory=FakeRuntime)


def test_destroy_closes_perseus_and_restores_the_engine(dist_world):
    engine, *_ = start({}, runtime_factory=FakeRuntime)
    handle = get_handle(engine)
    engine.destroy()
    assert handle.closed and handle.runtime.closed == 1
    assert installed_handle(engine) is None and get_handle(engine) is None
    assert "destroy" not in engine.__dict__
    handle.close()  # idempotent
    assert handle.runtime.closed == 1


def test_failure_while_hooking_closes_the_runtime(dist_world):
    created = []

    def factory(job, config, *, process_group=None):
        created.append(FakeRuntime(job, config))
        return created[-1]

    with pytest.raises(Exception, match="lacks on_step_begin"):
        start({}, runtime_factory=factory, listener_wrapper=lambda runtime: object())
    assert created[0].closed == 1


def test_non_pipeline_model_with_perseus_on_is_refused(dist_world):
    model = torch.nn.Linear(4, 4)
    config = {"train_micro_batch_size_per_gpu": 1, "perseus": {}}
    with pytest.raises(UnsupportedDeepSpeedFeature, match="not a DeepSpeed PipelineEngine"):
        initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config,
                   runtime_factory=FakeRuntime)


def test_real_runtime_measures_the_engine_on_a_simulated_gpu(dist_world, tmp_path, monkeypatch):
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    section = {"gpu": "sim", "sim_gpu": {"energy_update_period_s": 0}, "mode": "measure-only", "warmup_steps": 2,
               "cache_dir": None, "log_every_steps": 0}
    engine, *_ = start(section)
    handle = get_handle(engine)
    data = data_iterator(SHAPE)
    for _ in range(3):
        engine.train_batch(data)
    summary = handle.summary()
    assert summary["steps"] == 3 and summary["mode"] == "measure-only"
    assert summary["baseline"]["time_s"] > 0 and summary["baseline"]["energy_j"] > 0
    engine.destroy()
    assert handle.runtime._closed
