"""``--perseus`` command-line flags for Megatron-LM, and their translation to ``PerseusConfig``.

One flag per config field, made from the field itself (name, type, description as help, the enum's
values as choices), so every setting is reachable from Megatron and a new one needs no edit here;
the shorter names users already know stay, with the field's own name as an alias.
``add_perseus_args`` has the signature of Megatron-LM's ``extra_args_provider`` (takes the parser,
returns it). Every flag defaults to ``None`` so that ``PerseusConfig`` alone holds the defaults;
``config_from_args`` passes only the flags given, and validation errors name the flag.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import typing
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pydantic.fields import FieldInfo

from perseus.errors import ConfigError
from perseus.runtime import PerseusConfig, choices


@dataclass(frozen=True)
class Flag:
    """One ``--perseus-*`` flag and the ``PerseusConfig`` field it sets; ``aliases`` also set it."""

    option: str
    field: str
    type: Callable[[str], Any]
    help: str
    metavar: str | None = None
    choices: Sequence[str] | None = None
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")

    @property
    def options(self) -> tuple[str, ...]:
        return (self.option, *self.aliases)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"key\": 1}}', got {text!r}")
    return value


def _on_off(text: str) -> bool:
    """argparse type: on/off (also true/false, 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


# The names Megatron users already type where they are shorter than the field's own flag
# (``--perseus-`` + the field with dashes, which works too, as an alias).
SHORT_OPTIONS: dict[str, str] = {
    "freq_max_mhz": "--perseus-freq-max", "freq_min_mhz": "--perseus-freq-min", "freq_step_mhz": "--perseus-freq-step",
    "coarse_step_mhz": "--perseus-coarse-step", "p_blocking_w": "--perseus-p-blocking",
    "profile_path": "--perseus-profile", "frontier_path": "--perseus-frontier", "plan_wait_s": "--perseus-plan-wait",
    "close_plan_wait_s": "--perseus-close-plan-wait", "straggler_period_steps": "--perseus-straggler-period",
    "probe_every_steps": "--perseus-probe-every", "carbon_horizon_windows": "--perseus-carbon-horizon",
    "carbon_window_s": "--perseus-carbon-window", "carbon_stale_s": "--perseus-carbon-stale",
    "power_cap_w": "--perseus-power-cap", "grid_every_steps": "--perseus-grid-every",
    "grid_timeout_s": "--perseus-grid-timeout", "log_every_steps": "--perseus-log-every",
    "collective_timeout_s": "--perseus-collective-timeout", "clock_check_s": "--perseus-clock-check",
    "energy_poll_s": "--perseus-energy-poll",
}
# ``enabled`` is ``--perseus`` itself (a switch, not a value).
SWITCH_FIELD = "enabled"
# Metavars the field's name and type do not say (``_metavar``).
_METAVARS: dict[str, str] = {
    "freq_every_k": "K", "noise_k": "K", "guard_noise_z": "Z", "carbon_replay_speed": "X", "cache_dir": "DIR",
    "straggler_threshold": "FRACTION", "straggler_recover_threshold": "FRACTION", "guard_tolerance": "FRACTION",
    "carbon_time_budget": "FRACTION",
}
_UNIT_METAVARS: tuple[tuple[str, str], ...] = (
    ("_mhz", "MHZ"), ("_w", "WATTS"), ("_s", "SECONDS"), ("_seconds", "SECONDS"), ("_path", "PATH"), ("_file", "PATH"), ("_socket", "PATH"),
    ("_source", "SOURCE"),
)


def _value_type(annotation: Any) -> Any:
    """The type a field holds, without ``| None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if type(None) in typing.get_args(annotation) and len(args) == 1:
        return args[0]
    return annotation


def _parser_type(name: str, annotation: Any) -> Callable[[str], Any]:
    kind = _value_type(annotation)
    if kind is bool:
        return _on_off
    if kind in (int, float):
        return typing.cast(Callable[[str], Any], kind)
    if choices(name) or kind is str:
        return str
    return _json_object  # a mapping (sim_gpu) or a settings object given as one (planner_options)


def _metavar(name: str, parse: Callable[[str], Any]) -> str | None:
    if name in _METAVARS:
        return _METAVARS[name]
    if choices(name):
        return None
    if parse is _on_off:
        return "on|off"
    if parse is _json_object:
        return "JSON"
    unit = next((metavar for suffix, metavar in _UNIT_METAVARS if name.endswith(suffix)), None)
    return unit or ("N" if parse is int else "X" if parse is float else "TEXT")


def _flag(name: str, field: FieldInfo) -> Flag:
    own = "--perseus-" + name.replace("_", "-")
    option = SHORT_OPTIONS.get(name, own)
    parse = _parser_type(name, field.annotation)
    return Flag(option, name, parse, field.description or name, _metavar(name, parse), choices(name) or None,
                aliases=(own,) if option != own else ())


# Every field but ``enabled``, in the config's order: names, types, help (the field's description)
# and choices (its enum) all come from ``PerseusConfig``, so a new setting is a new flag.
FLAGS: tuple[Flag, ...] = tuple(_flag(name, field) for name, field in PerseusConfig.model_fields.items()
                                if name != SWITCH_FIELD)


def add_perseus_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the Perseus flag group; usable directly as Megatron-LM's ``extra_args_provider``."""
    group = parser.add_argument_group(title="perseus", description="GPU energy optimization (Perseus)")
    group.add_argument("--perseus", action="store_true", default=False,
                       help="enable Perseus: profile, plan and apply per-instruction GPU clocks")
    for flag in FLAGS:
        group.add_argument(*flag.options, dest=flag.dest, type=flag.type, default=None, help=flag.help,
                           metavar=flag.metavar, choices=flag.choices)
    return parser


def compose_providers(*providers: Callable[[argparse.ArgumentParser], Any] | None) -> Callable[[argparse.ArgumentParser], argparse.ArgumentParser]:
    """One ``extra_args_provider`` that applies several in order (``None`` entries are skipped)."""
    chain = [p for p in providers if p is not None]

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for add in chain:
            result = add(parser)
            parser = result if isinstance(result, argparse.ArgumentParser) else parser
        return parser

    return provider


_PERSEUS_ARGS_MARK = "__perseus_args__"
_PROVIDER = "extra_args_provider"


def with_perseus_args(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``add_perseus_args`` composed into its ``extra_args_provider``.

    ``fn`` is Megatron-LM's ``pretrain`` (core ≤ 0.17) or ``parse_and_validate_args`` (core ≥ 0.18);
    either one hands its provider to Megatron's parser. The ``pretrain_gpt.py`` that
    ``python -m perseus_megatron.patch`` edits wraps one of them, so that its call stays as
    Megatron wrote it and the parser still accepts ``--perseus*``. Idempotent.
    """
    if getattr(fn, _PERSEUS_ARGS_MARK, False):
        return fn
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the provider can only go by keyword
        parameters = []
    names = [p.name for p in parameters]
    if parameters and _PROVIDER not in names and not any(p.kind is p.VAR_KEYWORD for p in parameters):
        raise ConfigError(f"{getattr(fn, '__name__', fn)!s} takes no {_PROVIDER}, so Megatron's parser cannot get "
                          "the --perseus flags; run the script through python -m perseus_megatron.pretrain_gpt instead")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    index = names.index(_PROVIDER) if _PROVIDER in names else None
    by_position = index is not None and all(p.kind in positional for p in parameters[:index + 1])

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if by_position and index is not None and len(args) > index:
            args = (*args[:index], compose_providers(args[index], add_perseus_args), *args[index + 1:])
        else:
            kwargs[_PROVIDER] = compose_providers(kwargs.get(_PROVIDER), add_perseus_args)
        return fn(*args, **kwargs)

    setattr(call, _PERSEUS_ARGS_MARK, True)
    return call


def config_from_args(args: argparse.Namespace) -> PerseusConfig:
    """``PerseusConfig`` from parsed flags; a bad value is a ``ConfigError`` naming the flag."""
    if not hasattr(args, "perseus"):
        raise ConfigError("perseus flags are missing from the parsed arguments; add perseus_megatron.add_perseus_args "
                          "as (or into) the extra_args_provider")
    values: dict[str, Any] = {"enabled": bool(args.perseus)}
    for flag in FLAGS:
        value = getattr(args, flag.dest, None)
        if value is not None:
            values[flag.field] = value
    try:
        return PerseusConfig.from_dict(values)
    except ConfigError as exc:
        raise ConfigError(_name_flags(str(exc))) from None


def config_from_argv(argv: Sequence[str]) -> PerseusConfig:
    """Parse only the Perseus flags out of a full command line (other flags are left alone)."""
    parser = add_perseus_args(argparse.ArgumentParser(add_help=False, allow_abbrev=False))
    args, _ = parser.parse_known_args(list(argv))
    return config_from_args(args)


def _name_flags(message: str) -> str:
    """Say which command-line flag a config field came from: 'mode' → 'mode (--perseus-mode)'."""
    for flag in sorted(FLAGS, key=lambda f: -len(f.field)):
        message = message.replace(f"{flag.field}:", f"{flag.field} ({flag.option}):", 1)
    return message
