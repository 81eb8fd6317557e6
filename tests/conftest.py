"""Suite-wide collection order: the longest modules first, then the other multi-process ones.

Why: pytest.ini runs the suite on pytest-xdist workers, one module at a time per worker
(``--dist loadfile``), each worker taking the next module in collection order when it is nearly
done with its own. Longest first (the LPT rule) keeps a long module from starting last and one
worker busy while the other idles; short modules fill the gaps at the end. ``LONGEST`` holds the
modules measured longest, longest first (seconds on an idle 2-core machine with both workers
busy, docs/reliability.md); a stale or missing entry only changes the order. Then come the other
modules with ``distributed`` tests (30-60 s each), then the rest, each group in file order. Tests
within a module keep their order; nothing else depends on the order between modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LONGEST = (
    "deepspeed/test_deepspeed_unpadded.py",  # ~150 s, 2 launches beside a busy loop, one with default profiling
    "megatron/test_megatron_lm_pretrain_gpt.py",  # ~110 s, 4 launches of a real pretrain_gpt.py
    "planner/test_optimality.py",  # ~70 s, one core busy (the MILPs)
    "torch/test_torch_torchrun.py",  # ~60 s, 2 launches: orders, then the demos
    "megatron/test_megatron_torchrun.py",  # ~55 s, one 4-rank launch: orders, then the demo
    "megatron/test_megatron_dp_straggler.py",  # ~40 s
    "runtime/test_faults.py",  # ~40 s
    "deepspeed/test_deepspeed_dp_straggler.py",  # ~37 s
    "deepspeed/test_deepspeed_demo.py",  # ~30 s, one 4-rank launch
)


def module_rank(path: Path, distributed: bool) -> int:
    """Where a module goes: its place in ``LONGEST``, then distributed modules, then the rest."""
    try:
        return LONGEST.index(path.relative_to(TESTS).as_posix())
    except ValueError:
        return len(LONGEST) + (0 if distributed else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    heavy = {item.path for item in items if item.get_closest_marker("distributed") is not None}
    items.sort(key=lambda item: module_rank(item.path, item.path in heavy))  # stable: each module stays contiguous
