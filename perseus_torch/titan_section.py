"""The ``perseus`` section of a TorchTitan job config: one field per ``PerseusConfig`` setting.

Why generated from ``PerseusConfig``: TorchTitan parses its config with tyro from the dataclass
types, so every setting needs a typed field; making them from the config's own fields (name, type,
an enum's values as a ``Literal``) keeps every setting reachable from TorchTitan with no edit here,
as Megatron's ``--perseus-*`` flags are (perseus_megatron/args.py). Every field's default is
``PerseusConfig``'s (``cache_dir``'s as this process resolves it), so ``None`` means what it means
there (``cache_dir=None``: no cache) and TorchTitan's ``--help`` shows the real defaults; a mapping
setting (``sim_gpu``, ``planner_options``) is a JSON object in text. On TorchTitan's command line a
setting is ``--perseus.<field> VALUE``.

Importing this module imports neither torch nor TorchTitan.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal

from perseus.errors import ConfigError
from perseus.runtime import PerseusConfig, choices


def _value_type(annotation: Any) -> Any:
    """The type a field holds, without ``| None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(annotation) and len(args) == 1 else annotation


def _section_type(name: str, annotation: Any) -> Any:
    kind = _value_type(annotation)
    values = choices(name)
    if values:
        kind = Literal.__getitem__(values)  # a Literal of the field's values
    elif kind not in (bool, int, float):
        kind = str  # a string, or a mapping as JSON text
    return kind | None if type(None) in typing.get_args(annotation) else kind


# The settings given as JSON text (mappings and settings objects).
JSON_FIELDS = frozenset(name for name, field in PerseusConfig.model_fields.items()
                        if _value_type(field.annotation) not in (bool, int, float, str) and not choices(name))



def _defaults() -> dict[str, Any]:
    """``PerseusConfig``'s defaults as the section holds them (a mapping as JSON text)."""
    values = PerseusConfig().model_dump(mode="json")
    return {name: json.dumps(v, sort_keys=True) if name in JSON_FIELDS else v for name, v in values.items()}


PerseusSection: type = dataclasses.make_dataclass(
    "PerseusSection",
    [(name, _section_type(name, field.annotation),
      dataclasses.field(default=default, metadata={"help": field.description}))
     for (name, field), default in zip(PerseusConfig.model_fields.items(), _defaults().values())],
    kw_only=True,
)
PerseusSection.__doc__ = ("Perseus's settings in a TorchTitan job config (``--perseus.<field>``), "
                          "PerseusConfig's defaults.")
PerseusSection.__module__ = __name__


def section_config(section: Any) -> PerseusConfig:
    """The ``PerseusConfig`` a section sets; a bad value is one ``ConfigError`` line naming the
    setting as TorchTitan's command line does."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if field.name in JSON_FIELDS and isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--perseus.{field.name}: not a JSON object ({exc.msg}): {value!r}; "
                                  "give one such as '{\"key\": 1}'") from None
        values[field.name] = value
    try:
        return PerseusConfig.from_dict(values)
    except ConfigError as exc:
        raise ConfigError(f"TorchTitan's perseus section (--perseus.<field>): {exc}") from None
