"""Suite-wide collection order: modules that launch multi-process jobs come first.

Why: pytest.ini runs the suite on pytest-xdist workers, one module at a time per worker
(``--dist loadfile``). Modules with ``distributed`` tests take 30-300 s each, most others a few
seconds. Started first, the long ones spread over the workers and the short ones fill the gaps at
the end, instead of a long module starting last and keeping one worker busy while the others idle.
Tests within a module keep their order; nothing else depends on the order between modules.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    heavy = {item.path for item in items if item.get_closest_marker("distributed") is not None}
    items.sort(key=lambda item: item.path not in heavy)  # stable: each module stays contiguous and in order
