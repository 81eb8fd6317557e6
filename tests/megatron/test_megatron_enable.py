"""``enable()`` / ``enable_from_argv()`` without a training loop: config handling and hook lifetime."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

from perseus.errors import ConfigError
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob, RecordingListener
from perseus_megatron import enable, enable_from_argv, hooks
from perseus_megatron.integration import MegatronPerseus
from perseus_megatron.tracker import StepInfo
from megatron_fixtures import no_leftover_hooks  # noqa: F401 - pytest fixtures, found by their names


def test_enable_installs_hooks_and_close_removes_them_idempotently():
    handle = enable(mode="profile", cache_dir=None)
    assert handle.config.mode == "profile" and hooks.active_handle() is not None
    handle.close()
    handle.close()
    assert hooks.active_handle() is None


def test_overrides_apply_on_top_of_a_config_object_or_mapping():
    assert enable(PerseusConfig(mode="plan"), warmup_steps=4).config.model_dump()["warmup_steps"] == 4
    hooks.active_handle().uninstall()
    assert enable({"mode": "plan"}, gpu="sim").config.gpu == "sim"


@pytest.mark.parametrize("config, overrides, match", [
    (42, {}, "PerseusConfig or a mapping"),
    (None, {"mode": "fastest"}, "mode"),
    (None, {"no_such_setting": 1}, "unknown setting"),
])
def test_bad_configuration_is_a_config_error_and_installs_nothing(config, overrides, match):
    with pytest.raises(ConfigError, match=match):
        enable(config, **overrides)
    assert hooks.active_handle() is None


def test_disabled_config_leaves_megatron_untouched():
    handle = enable(enabled=False)
    assert hooks.active_handle() is None
    assert handle.summary() == {}
    handle.close()


def test_enable_from_argv_follows_the_perseus_flag():
    assert enable_from_argv(["--lr", "1e-4"]) is None and hooks.active_handle() is None
    handle = enable_from_argv(["--lr", "1e-4", "--perseus", "--perseus-mode", "measure-only"])
    assert handle is not None and handle.config.mode == "measure-only" and hooks.active_handle() is not None
    handle.close()


def test_runtime_is_created_once_per_job_shape_and_replaced_when_it_changes():
    created: list[tuple[PipelineJob, RecordingListener]] = []

    class FakeRuntime(RecordingListener):
        def __init__(self, job, config, process_group=None):
            super().__init__()
            self.closed = False
            created.append((job, self))

        def close(self):
            self.closed = True

    def job_for(info: StepInfo) -> PipelineJob:
        return PipelineJob(num_stages=2, num_microbatches=info.num_microbatches, stage=0)

    perseus = MegatronPerseus(PerseusConfig(), runtime_factory=FakeRuntime, job_builder=job_for)
    first = perseus._listener_for_step(StepInfo("1f1b", 4))
    assert perseus._listener_for_step(StepInfo("1f1b", 4)) is first and len(created) == 1
    second = perseus._listener_for_step(StepInfo("1f1b", 6))
    assert second is not first and first.closed and created[-1][0].num_microbatches == 6
    perseus.close()
    assert second.closed


def fake_parallel_state(monkeypatch) -> None:
    """megatron-core's parallel state of stage 1 in a 4-stage pipeline, no TP, CP or DP."""
    from megatron.core import parallel_state as ps

    state = {"model_parallel_is_initialized": True, "get_pipeline_model_parallel_world_size": 4,
             "get_pipeline_model_parallel_rank": 1, "get_tensor_model_parallel_world_size": 1,
             "get_context_parallel_world_size": 1, "get_data_parallel_rank": 0, "get_data_parallel_world_size": 1,
             "get_context_parallel_rank": 0, "get_tensor_model_parallel_rank": 0}
    for name, value in state.items():
        monkeypatch.setattr(ps, name, lambda value=value: value)


@pytest.mark.parametrize("group, recorded", [(6, 6), (4, None), (None, None)])
def test_the_job_carries_a_non_default_microbatch_group_size(monkeypatch, group, recorded):
    """megatron-core's microbatch_group_size_per_vp_stage ≠ pipeline size is planned, not refused."""
    from perseus_megatron.integration import job_from_parallel_state

    fake_parallel_state(monkeypatch)
    job = job_from_parallel_state(StepInfo("interleaved", 12, 2, group))
    assert job.group_size == recorded
    assert job.build_schedule().group_size == recorded
    one_f_one_b = job_from_parallel_state(StepInfo("1f1b", 12, 1, None))
    assert one_f_one_b.group_size is None and one_f_one_b.build_schedule().name == "1f1b"


@pytest.mark.parametrize("schedule, overlap, recorded", [("interleaved", True, True), ("interleaved", False, False),
                                                         ("1f1b", True, False)])
def test_the_step_and_the_job_carry_megatrons_overlap_p2p_comm(monkeypatch, schedule, overlap, recorded):
    """Megatron-LM runs interleaved pipelines with overlap_p2p_comm on by default: the same order
    with other waits, so the planned schedule must know (1F1B's exchanges ignore the flag)."""
    from megatron.core import ModelParallelConfig

    from perseus_megatron import hooks
    from perseus_megatron.integration import job_from_parallel_state

    import torch

    config = ModelParallelConfig(pipeline_model_parallel_size=4, pipeline_dtype=torch.float32,
                                 overlap_p2p_comm=overlap, batch_p2p_comm=not overlap)
    monkeypatch.setattr(hooks, "_model_config", lambda model: config)
    chunks = 2 if schedule == "interleaved" else 1
    info = hooks._step_info(schedule, {"model": [object()] * chunks, "num_microbatches": 8})
    assert info.overlap_p2p is recorded
    fake_parallel_state(monkeypatch)
    job = job_from_parallel_state(info)
    assert job.overlap_p2p is recorded and job.build_schedule().overlap_p2p is recorded


def test_a_restart_for_a_new_job_shape_does_not_wait_for_planning_but_the_runs_end_does():
    """Batch-size ramp-up: the old shape's planner is stopped at once (no stall mid-training); the
    run's end keeps the config's ``close_plan_wait_s``."""
    created: list = []

    class WaitingRuntime(RecordingListener):
        def __init__(self, job, config, process_group=None):
            super().__init__()
            self.closed_with: list = []
            created.append(self)

        def close(self, *, plan_wait_s=None):
            self.closed_with.append(plan_wait_s)

    perseus = MegatronPerseus(PerseusConfig(), runtime_factory=WaitingRuntime,
                              job_builder=lambda info: PipelineJob(num_stages=2, num_microbatches=info.num_microbatches,
                                                                   stage=0))
    perseus._listener_for_step(StepInfo("1f1b", 4))
    perseus._listener_for_step(StepInfo("1f1b", 6))
    perseus.close()
    assert [r.closed_with[:1] for r in created] == [[0.0], [None]]
