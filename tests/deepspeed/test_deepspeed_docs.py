"""The configuration reference (docs/reference/config.md, generated from ``PerseusConfig``) gives every
field of the "perseus" section its DeepSpeed key and current default, and docs/deepspeed.md points
to it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from perseus.runtime.config import PerseusConfig
from perseus_deepspeed.job import SECTION

DOCS = Path(__file__).resolve().parents[2] / "docs"
REFERENCE = DOCS / "reference" / "config.md"


def _reference_rows() -> dict[str, tuple[str, str]]:
    """field -> (DeepSpeed key, default) from the reference's table."""
    rows: dict[str, tuple[str, str]] = {}
    for line in REFERENCE.read_text().split("## Environment variables", 1)[0].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # "\|" is a pipe in a cell
        if len(cells) >= 6 and cells[0].startswith("`") and cells[2].startswith(f"`{SECTION}."):
            rows[cells[0].strip("`")] = (cells[2].strip("`"), cells[4].strip("`"))
    return rows


def _overrides(value):
    """Typed settings (``PlannerOptions``) are documented by what they override: ``{}`` by default."""
    return value.overrides()


def test_every_config_field_is_in_the_reference_with_its_deepspeed_key_and_default(monkeypatch):
    # A default computed per user (cache_dir: the user's cache directory) is documented as a user
    # without $PERSEUS_CACHE_DIR or $XDG_CACHE_HOME sees it, with the home directory as ``~``.
    monkeypatch.delenv("PERSEUS_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "/HOME")
    rows = _reference_rows()
    for name, field in PerseusConfig.model_fields.items():
        assert name in rows, f"docs/reference/config.md: PerseusConfig field {name!r} is missing"
        key, documented = rows[name]
        assert key == f"{SECTION}.{name}"
        default = json.dumps(field.get_default(call_default_factory=True), default=_overrides).replace("/HOME", "~", 1)
        assert documented == default, f"docs/reference/config.md: {name} default is {default}, the table says {documented}"
    assert set(rows) <= set(PerseusConfig.model_fields), set(rows) - set(PerseusConfig.model_fields)


def test_the_deepspeed_guide_points_to_the_reference():
    guide = (DOCS / "deepspeed.md").read_text()
    section = guide.split('## The `"perseus"` section: reference', 1)[1].split("\n## ", 1)[0]
    assert "(reference/config.md)" in section
