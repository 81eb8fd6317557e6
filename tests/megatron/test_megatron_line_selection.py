"""The list of tests/megatron modules the Python 3.12 line leaves out (tests/megatron/megatron_lines.py)."""

from __future__ import annotations

from megatron_lines import HERE, MARKER, RUN_ONCE


def test_every_module_run_once_exists_and_says_why():
    missing = [name for name in RUN_ONCE if not (HERE / name).is_file()]
    assert missing == [], f"tests/megatron/megatron_lines.py lists modules that do not exist: {missing}"
    assert all(reason.strip() for reason in RUN_ONCE.values())


def test_the_listed_modules_get_the_marker_the_312_line_deselects(request):
    assert request.node.path.name in RUN_ONCE  # this module is listed: it checks the list, not megatron-core
    assert request.node.get_closest_marker(MARKER) is not None
    script = (HERE.parents[1] / "scripts" / "megatron_py312.sh").read_text()
    assert f'-m "not {MARKER}"' in script
