"""Fixtures for CLI tests: small synthetic profiles and hand-built multi-point frontiers.

The planner may return any number of points, so tests that need several build a frontier here
from simple (valid, not optimal) plans: every instruction at one clock, or only the lighter
stages slowed. Each point's time and energy are simulated on the profile, like the planner's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import P_BLOCKING, heuristic_frontier, write_profile_csv

from perseus.frontier import Frontier
from perseus.profile import load_csv
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier


@pytest.fixture
def small_profile_csv(tmp_path: Path) -> Path:
    return write_profile_csv(tmp_path / "prof.csv")


@pytest.fixture
def small_frontier(small_profile_csv: Path) -> Frontier:
    profile = load_csv(small_profile_csv, P_BLOCKING)
    return heuristic_frontier(build_schedule("1f1b", 2, 4), profile)


@pytest.fixture
def small_frontier_file(tmp_path: Path, small_frontier: Frontier, small_profile_csv: Path) -> Path:
    small_frontier.metadata["profile"] = str(small_profile_csv)
    path = tmp_path / "frontier.json"
    save_frontier(small_frontier, path)
    return path
