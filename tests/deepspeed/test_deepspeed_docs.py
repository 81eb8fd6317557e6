"""docs/deepspeed.md documents every field of the "perseus" section with its current default."""

from __future__ import annotations

import json
import re
from pathlib import Path

from perseus.runtime.config import PerseusConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "deepspeed.md"


def _reference_rows() -> dict[str, str]:
    text = DOC.read_text()
    section = text.split("## The `\"perseus\"` section: reference", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                rows[name] = cells[1].strip("`")
    return rows


def _overrides(value):
    """Typed settings (``PlannerOptions``) are documented by what they override: ``{}`` by default."""
    return value.overrides()


def test_every_config_field_is_in_the_reference_table_with_its_default():
    rows = _reference_rows()
    for name, field in PerseusConfig.model_fields.items():
        assert name in rows, f"docs/deepspeed.md: PerseusConfig field {name!r} is missing from the reference table"
        default = json.dumps(field.get_default(call_default_factory=True), default=_overrides)
        assert rows[name] == default, f"docs/deepspeed.md: {name} default is {default}, the table says {rows[name]}"
    assert set(rows) <= set(PerseusConfig.model_fields), set(rows) - set(PerseusConfig.model_fields)
