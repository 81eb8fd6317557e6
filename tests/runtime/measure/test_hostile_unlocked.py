"""``benchmarks/hostile_unlocked.py`` on the simulated H200 (a memory-bound forward, a dense
backward under the power cap), run small: the fastest plan is no slower than the unlocked card,
and each kind has its own sustained clock (the memory-bound one's 1,980, not the dense one's
1,530), its clocks up to it measured. Step times are the simulated GPU's own kernel times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import hostile_unlocked as bench  # the benchmarks folder is not a package


@pytest.fixture(scope="module")
def run() -> bench.Run:
    return bench.run(seed=0, steps=3)


def test_the_fastest_plan_is_no_slower_than_the_unlocked_card(run):
    assert run.fastest_s / run.unlocked_s <= 1.01, run.facts()


def test_the_memory_bound_kind_has_its_own_sustained_clock_not_the_dense_kinds(run):
    """One sustained clock per card made it 1,530 MHz for both (the dense backward's samples are
    most of them): the forward's clocks above 1,530 were copies of its 1,530 point."""
    forward, backward = run.profile.get(0, "forward"), run.profile.get(0, "backward")
    assert forward.unlocked is not None and forward.unlocked.sustained_mhz == 1980
    assert backward.unlocked is not None and backward.unlocked.sustained_mhz == 1530
    assert forward.at(1980)[0] < forward.at(1530)[0], "the forward at 1,980 MHz is measured, not 1,530's copy"
    assert backward.at(1980) == backward.at(1530), "the dense backward above its clock: its clock's point"
    assert all(f <= 1530 for f, inst in zip(run.clocks_mhz, bench.JOB.build_schedule().stages[0])
               if inst.kind == "backward" and f > 0), "no lock above the dense kind's sustained clock"

