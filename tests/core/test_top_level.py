"""``perseus`` exports the names a user types, lazily: importing it loads no planner, numba or torch."""

from __future__ import annotations

import subprocess
import sys

import perseus


def test_every_exported_name_resolves_to_its_defining_object():
    from perseus.frontier import load_frontier
    from perseus.planner import plan_frontier
    from perseus.schedules import build_schedule

    assert perseus.plan_frontier is plan_frontier
    assert perseus.build_schedule is build_schedule
    assert perseus.load_frontier is load_frontier
    for name in perseus.__all__:
        assert getattr(perseus, name) is not None, name


def test_import_perseus_is_cheap():
    code = ("import sys, perseus; heavy = [m for m in ('numba', 'torch', 'scipy', 'perseus.planner') if m in sys.modules];"
            " print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_an_unknown_name_is_an_attribute_error():
    try:
        perseus.no_such_name  # noqa: B018 - the attribute access alone is what is tested
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
