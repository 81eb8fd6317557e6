"""tests/megatron: the modules listed in ``megatron_lines.RUN_ONCE`` get the marker that the Python
3.12 line (scripts/megatron_py312.sh) deselects; megatron_lines.py says why each runs once."""

from __future__ import annotations

import pytest

from megatron_lines import HERE, MARKER, RUN_ONCE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE and item.path.name in RUN_ONCE:
            item.add_marker(MARKER)
