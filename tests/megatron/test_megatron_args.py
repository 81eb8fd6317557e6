"""``--perseus`` flags on a plain argparse parser (Megatron-LM's extra_args_provider contract)."""

from __future__ import annotations

import argparse

import pytest

from perseus.errors import ConfigError
from perseus.runtime.config import PerseusConfig
from perseus_megatron.args import FLAGS, add_perseus_args, compose_providers, config_from_args, config_from_argv


def _megatron_like_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--micro-batch-size", type=int)
    return parser


def test_every_flag_sets_an_existing_config_field():
    fields = set(PerseusConfig.model_fields)
    assert {f.field for f in FLAGS} <= fields
    assert len({f.option for f in FLAGS}) == len(FLAGS)


def test_flags_parse_into_a_validated_config_alongside_megatron_arguments():
    parser = add_perseus_args(_megatron_like_parser())
    args = parser.parse_args([
        "--num-layers", "4", "--perseus", "--perseus-mode", "profile", "--perseus-gpu", "sim",
        "--perseus-cache-dir", "/ckpt/perseus", "--perseus-straggler-threshold", "0.1",
        "--perseus-straggler-period", "20", "--perseus-freq-min", "900", "--perseus-freq-max", "1410",
        "--perseus-freq-step", "30", "--perseus-metrics-file", "m.jsonl", "--perseus-sim-gpu", '{"preset": "A40"}',
        "--perseus-warmup-steps", "3",
    ])
    assert args.num_layers == 4
    config = config_from_args(args)
    assert config.enabled and config.mode == "profile" and config.gpu == "sim"
    assert config.cache_dir == "/ckpt/perseus" and config.metrics_file == "m.jsonl"
    assert config.straggler_threshold == 0.1 and config.straggler_period_steps == 20
    assert (config.freq_min_mhz, config.freq_max_mhz, config.freq_step_mhz) == (900, 1410, 30)
    assert config.sim_gpu == {"preset": "A40"} and config.warmup_steps == 3


def test_unset_flags_keep_the_config_defaults_and_no_perseus_means_disabled():
    args = add_perseus_args(_megatron_like_parser()).parse_args(["--num-layers", "2"])
    config = config_from_args(args)
    defaults = PerseusConfig()
    assert not config.enabled
    assert config.model_dump(exclude={"enabled"}) == defaults.model_dump(exclude={"enabled"})


def test_invalid_value_names_the_flag():
    args = add_perseus_args(_megatron_like_parser()).parse_args(["--perseus", "--perseus-warmup-steps", "0"])
    with pytest.raises(ConfigError, match=r"warmup_steps \(--perseus-warmup-steps\)"):
        config_from_args(args)


def test_planner_options_flag_maps_onto_the_planners_settings_and_a_typo_fails_at_startup():
    from perseus.planner import PlannerOptions

    parser = add_perseus_args(_megatron_like_parser())
    config = config_from_args(parser.parse_args(["--perseus", "--perseus-planner-options", '{"num_anchors": 16}']))
    assert config.planner_options == PlannerOptions(num_anchors=16)
    with pytest.raises(ConfigError, match="unknown planner option.*num_anchor"):
        config_from_args(parser.parse_args(["--perseus", "--perseus-planner-options", '{"num_anchor": 16}']))


def test_impossible_combination_is_a_config_error():
    args = add_perseus_args(_megatron_like_parser()).parse_args(
        ["--perseus", "--perseus-freq-min", "1500", "--perseus-freq-max", "900"]
    )
    with pytest.raises(ConfigError, match="freq_min_mhz"):
        config_from_args(args)


@pytest.mark.parametrize("argv", [["--perseus-mode", "fast"], ["--perseus-sim-gpu", "[1, 2]"], ["--perseus-sim-gpu", "{"]])
def test_bad_flag_values_are_rejected_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit):
        add_perseus_args(_megatron_like_parser()).parse_args(argv)
    assert "--perseus-" in capsys.readouterr().err


def test_missing_flag_group_is_explained():
    with pytest.raises(ConfigError, match="add_perseus_args"):
        config_from_args(argparse.Namespace(num_layers=2))


def test_config_from_argv_ignores_other_flags():
    config = config_from_argv(["--num-layers", "4", "--perseus", "--perseus-mode", "plan", "--lr", "1e-4"])
    assert config.enabled and config.mode == "plan"


def test_composed_providers_apply_in_order_and_skip_none():
    calls = []

    def theirs(parser):
        calls.append("theirs")
        parser.add_argument("--modelopt-flag", action="store_true")
        return parser

    provider = compose_providers(theirs, None, add_perseus_args)
    parser = provider(_megatron_like_parser())
    args = parser.parse_args(["--modelopt-flag", "--perseus"])
    assert calls == ["theirs"] and args.modelopt_flag and args.perseus


def test_switch_ahead_flag_takes_on_or_off():
    parser = add_perseus_args(_megatron_like_parser())
    on = config_from_args(parser.parse_args(["--perseus"]))
    off = config_from_args(parser.parse_args(["--perseus", "--perseus-switch-ahead", "off"]))
    assert on.switch_ahead is True and off.switch_ahead is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--perseus", "--perseus-switch-ahead", "maybe"])
