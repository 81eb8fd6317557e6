"""Every ``PerseusConfig`` field is settable from each adapter: Megatron's ``--perseus-*`` flags,
DeepSpeed's ``"perseus"`` section and ``perseus_torch.enable``'s config, and a value set through
each lands in the runtime's config. A new field without a way in from an adapter fails here."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from perseus.runtime import PerseusConfig
from perseus_megatron.args import FLAGS, SHORT_OPTIONS, SWITCH_FIELD, add_perseus_args, config_from_args

# A value other than the default for every field, in two groups because some fields exclude each
# other (a fixed power cap or its source; a profile or a frontier).
GROUP_A: dict[str, Any] = {
    "enabled": False, "mode": "measure-only", "without_clock_access": "fail", "gpu": "sim", "device_index": 3, "sim_gpu": {"preset": "A40"},
    "zeusd_socket": "/run/zeusd.sock", "freq_max_mhz": 1410, "freq_min_mhz": 900, "freq_step_mhz": 30,
    "warmup_steps": 4, "iters_per_freq": 5, "early_stop_patience": 3, "coarse_step_mhz": 120,
    "refine_max_clocks": 4, "remeasure_max": 1, "noise_k": 1.5, "spread_k": 0.5, "p_blocking_w": 75.0, "p_blocking_seconds": 0.5,
    "energy_poll_s": 0.004, "profile_path": "profile.json", "planner_options": {"num_anchors": 16},
    "planner_nice": 5, "plan_wait_s": 2.0, "close_plan_wait_s": 10.0, "switch_ahead": False, "trace_clocks": True,
    "straggler_period_steps": 20, "straggler_threshold": 0.1, "straggler_recover_threshold": 0.03,
    "straggler_patience": 4, "probe_every_steps": 25, "probe_longest_steps": 100, "probe_block_steps": 2, "attribution_intervals": 12,
    "guard_threshold": 6.5, "guard_tolerance": 0.02, "guard_patience": 5,
    "guard_noise_z": 3.0, "collective_timeout_s": 60.0, "control_plane": "flat", "process_hooks": False,
    "clock_check_s": 0.5,
    "carbon_source": "trace.csv", "carbon_time_budget": 0.05, "carbon_horizon_windows": 24,
    "carbon_window_s": 900.0, "carbon_stale_s": 1800.0, "carbon_replay_speed": 60.0, "power_cap_w": 1200.0,
    "grid_every_steps": 5, "grid_timeout_s": 2.0, "cache_dir": "/ckpt/perseus", "metrics_file": "m.jsonl",
    "log_every_steps": 10, "prometheus_port": 9400, "prometheus_addr": "0.0.0.0",
}
GROUP_B: dict[str, Any] = {"freq_every_k": 2, "frontier_path": "frontier.json", "power_cap_source": "file:cap.txt"}
GROUPS = [GROUP_A, GROUP_B]


def _expected(values: dict[str, Any]) -> dict[str, Any]:
    return {name: PerseusConfig.from_dict(values).model_dump(mode="json")[name] for name in values}


def _landed(config: PerseusConfig, values: dict[str, Any]) -> dict[str, Any]:
    dumped = config.model_dump(mode="json")
    return {name: dumped[name] for name in values}


def test_the_samples_cover_every_field_with_a_value_other_than_its_default():
    assert set(GROUP_A) | set(GROUP_B) == set(PerseusConfig.model_fields)
    defaults = PerseusConfig().model_dump(mode="json")
    for group in GROUPS:
        assert all(value != defaults[name] for name, value in _expected(group).items())


def _argv(values: dict[str, Any], alias: bool) -> list[str]:
    by_field = {flag.field: flag for flag in FLAGS}
    argv = [] if values.get(SWITCH_FIELD) is False else ["--perseus"]  # ``enabled`` is the switch
    for name, value in values.items():
        if name == SWITCH_FIELD:
            continue
        flag = by_field[name]
        text = ("on" if value else "off") if isinstance(value, bool) else \
            json.dumps(value) if isinstance(value, dict) else str(value)
        argv += [flag.options[-1] if alias else flag.option, text]
    return argv


@pytest.mark.parametrize("alias", [False, True], ids=["flag", "field-named flag"])
@pytest.mark.parametrize("group", GROUPS, ids=["a", "b"])
def test_every_field_is_reachable_from_megatrons_flags(group, alias):
    args = add_perseus_args(argparse.ArgumentParser(allow_abbrev=False)).parse_args(_argv(group, alias))
    assert _landed(config_from_args(args), group) == _expected(group)


def test_the_flags_come_from_the_fields_and_the_short_names_stay():
    assert {flag.field for flag in FLAGS} == set(PerseusConfig.model_fields) - {SWITCH_FIELD}
    options = [option for flag in FLAGS for option in flag.options]
    assert len(options) == len(set(options))
    for flag in FLAGS:
        field = PerseusConfig.model_fields[flag.field]
        assert flag.help == field.description and flag.options[-1] == "--perseus-" + flag.field.replace("_", "-")
        assert flag.option == SHORT_OPTIONS.get(flag.field, flag.options[-1])
    mode = next(flag for flag in FLAGS if flag.field == "mode")
    assert mode.choices == ("profile", "plan", "run", "measure-only")


class _Engine:
    """What ``perseus_deepspeed`` reads a config from: the dict handed to ``deepspeed.initialize``."""

    def __init__(self, section: dict[str, Any]) -> None:
        self.config = {"train_batch_size": 4, "perseus": section}


@pytest.mark.parametrize("group", GROUPS, ids=["a", "b"])
def test_every_field_is_reachable_from_the_deepspeed_section(group):
    from perseus_deepspeed.integration import resolve_config

    engine = _Engine(json.loads(json.dumps(group)))  # as a JSON config file holds it
    assert _landed(resolve_config(engine, None), group) == _expected(group)


@pytest.mark.parametrize("group", GROUPS, ids=["a", "b"])
def test_every_field_is_reachable_from_the_torch_adapter(group, tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    import perseus_torch
    from perseus.runtime import RecordingListener

    class Runtime(RecordingListener):
        def __init__(self, job: Any, config: PerseusConfig, *, process_group: Any = None) -> None:
            super().__init__()
            self.config = config

        def close(self) -> None:
            pass

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        stage = PipelineStage(torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"))
        schedule = Schedule1F1B(stage, 2, loss_fn=lambda out, target: out.sum())
        handle = perseus_torch.enable(schedule, stage, group, runtime_factory=Runtime)
        try:
            assert _landed(handle.runtime.config, group) == _expected(group)
        finally:
            handle.close()
    finally:
        dist.destroy_process_group()
