"""docs/architecture.md's room table names every module of the tree, so the map stays the territory."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [p for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("perseus")]


def test_every_module_is_in_the_room_table():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in pkg.rglob("*.py") if p.name != "__init__.py")
    assert modules, "no modules found"
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert missing == [], f"docs/architecture.md does not name: {missing}"
