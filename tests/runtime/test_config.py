"""Configuration validation: every invalid value is a one-line ConfigError before training."""

import pytest

from perseus.errors import ConfigError
from perseus.runtime.config import MIN_PROBE_EVERY_STEPS, MODES, ControlPlaneDesign, Mode, PerseusConfig, choices
from perseus.runtime.guard.closed_loop import settings_from
from perseus.runtime.guard.placement import ProbePlacement


def test_defaults_are_valid_and_run_mode():
    cfg = PerseusConfig.from_dict({})
    assert cfg.mode == "run" and cfg.enabled and cfg.warmup_steps >= 1
    assert PerseusConfig.from_dict(None) == cfg


def test_from_dict_accepts_valid_values():
    cfg = PerseusConfig.from_dict({"mode": "measure-only", "gpu": "sim", "freq_min_mhz": 900, "freq_max_mhz": 1400,
                                   "freq_step_mhz": 100, "iters_per_freq": 3, "metrics_file": "m.jsonl"})
    assert cfg.mode == "measure-only" and cfg.freq_step_mhz == 100 and cfg.iters_per_freq == 3


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"mode": "fast"}, ["mode", "profile, plan, run, measure-only"]),
        ({"gpu": "cuda"}, ["gpu"]),
        ({"warmup_steps": 0}, ["warmup_steps", "greater than or equal to 1"]),
        ({"iters_per_freq": -2}, ["iters_per_freq"]),
        ({"iters_per_freq": "many"}, ["iters_per_freq", "integer"]),
        ({"freq_min_mhz": 1500, "freq_max_mhz": 900}, ["freq_min_mhz", "above freq_max_mhz"]),
        ({"freq_step_mhz": 100, "freq_every_k": 3}, ["freq_step_mhz", "freq_every_k"]),
        ({"straggler_threshold": 0.02, "straggler_recover_threshold": 0.05}, ["straggler_recover_threshold", "hysteresis"]),
        ({"straggler_threshold": 0}, ["straggler_threshold"]),
        ({"profile_path": "p.json", "frontier_path": "f.json"}, ["profile_path or frontier_path"]),
        ({"warmup_step": 3}, ["warmup_step", "unknown setting", "warmup_steps"]),
        ({"p_blocking_w": -5}, ["p_blocking_w"]),
        ({"planner_options": {"num_anchor": 8}}, ["planner_options", "unknown planner option", "num_anchor",
                                                  "num_anchors"]),
        ({"planner_options": {"beam_width": -1}}, ["planner_options", "beam_width", ">= 0"]),
        ({"planner_options": {"num_anchors": "8"}}, ["planner_options", "num_anchors", "'8'"]),
        ({"probe_every_steps": 3}, ["probe_every_steps (3)", "no counted plan step", "0 (off) or at least 4"]),
        ({"probe_every_steps": -1}, ["probe_every_steps"]),
        ({"guard_tolerance": 0.5}, ["guard_tolerance"]),
        ({"guard_tolerance": -0.01}, ["guard_tolerance"]),
        ({"guard_patience": 0}, ["guard_patience"]),
        ({"guard_noise_z": -1}, ["guard_noise_z"]),
    ],
)
def test_invalid_values_raise_one_line_config_error(bad, words):
    with pytest.raises(ConfigError) as info:
        PerseusConfig.from_dict(bad)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("invalid perseus config")
    for w in words:
        assert w in msg


def test_non_mapping_is_rejected():
    with pytest.raises(ConfigError, match="mapping"):
        PerseusConfig.from_dict(["mode", "run"])  # type: ignore[arg-type]  # the wrong type is what is tested


def test_replace_validates():
    cfg = PerseusConfig.from_dict({})
    assert cfg.replace(mode="plan").mode == "plan"
    with pytest.raises(ConfigError):
        cfg.replace(warmup_steps=0)


def test_planner_options_become_the_planners_typed_settings():
    from perseus.planner import PlannerOptions

    cfg = PerseusConfig.from_dict({"planner_options": {"num_anchors": 8, "beam_width": 0}})
    assert cfg.planner_options == PlannerOptions(num_anchors=8, beam_width=0)
    assert PerseusConfig().planner_options == PlannerOptions()
    assert cfg.replace(mode="plan").planner_options == cfg.planner_options
    assert cfg.model_dump()["planner_options"]["num_anchors"] == 8


def test_planner_options_default_overrides_nothing():
    from perseus.planner import PlannerOptions

    assert PerseusConfig().planner_options.overrides() == {}
    assert PlannerOptions(num_anchors=8).overrides() == {"num_anchors": 8}


def test_guard_settings_come_from_the_config():
    cfg = PerseusConfig.from_dict({"probe_every_steps": 20, "probe_longest_steps": 300, "guard_tolerance": 0.02,
                                   "guard_threshold": 5.0})
    g = settings_from(cfg)
    assert (g.tolerance, g.threshold, g.backoff.first, g.backoff.longest) == (0.02, 5.0, 20, 300)
    assert PerseusConfig().probe_every_steps == 6 and PerseusConfig().guard_tolerance == 0.01
    assert PerseusConfig.from_dict({"guard_patience": 2, "guard_noise_z": 1.5}).guard_patience == 2  # older configs load


def test_the_configs_smallest_probe_window_is_the_placements():
    assert MIN_PROBE_EVERY_STEPS == ProbePlacement(seed=0).shortest()
    with pytest.raises(ConfigError, match="at least 5"):
        PerseusConfig.from_dict({"probe_every_steps": 4, "probe_block_steps": 2})


def test_mode_is_parsed_to_the_enum_and_keeps_its_string():
    cfg = PerseusConfig.from_dict({"mode": "measure-only", "control_plane": "flat"})
    assert cfg.mode is Mode.MEASURE_ONLY and cfg.control_plane is ControlPlaneDesign.FLAT
    assert str(cfg.mode) == f"{cfg.mode}" == "measure-only" and cfg.model_dump(mode="json")["mode"] == "measure-only"
    assert cfg.replace(noise_k=1.0).mode is Mode.MEASURE_ONLY


@pytest.mark.parametrize("mode, controls, profiles, plans, deploys", [
    ("profile", True, True, False, False),
    ("plan", True, True, True, False),
    ("run", True, True, True, True),
    ("measure-only", False, False, True, False),
])
def test_what_each_mode_does(mode, controls, profiles, plans, deploys):
    m = Mode(mode)
    assert (m.controls_clocks, m.profiles, m.plans, m.deploys) == (controls, profiles, plans, deploys)
    assert m.description


def test_each_list_of_choices_is_defined_once():
    from perseus.gpu.factory import KINDS
    from perseus.runtime.plane.design import DESIGNS

    assert choices("mode") == MODES == ("profile", "plan", "run", "measure-only")
    assert choices("control_plane") == DESIGNS == ("hierarchical", "flat")
    assert choices("gpu") == KINDS
    assert choices("noise_k") == ()


@pytest.mark.parametrize("field, value", [("mode", "fast"), ("control_plane", "ring"), ("gpu", "tpu")])
def test_a_value_outside_the_choices_names_them(field, value):
    with pytest.raises(ConfigError, match=f"{field}: must be one of {', '.join(choices(field))} \\(got '{value}'\\)"):
        PerseusConfig.from_dict({field: value})
