"""Reading back what DeepSpeed's csv_monitor wrote."""

from __future__ import annotations

import csv
from pathlib import Path


def read_csv(folder: Path, name: str) -> list[tuple[int, float]]:
    """One monitor event's CSV (``perseus/energy_j`` -> ``perseus_energy_j.csv``): [(step, value)]."""
    with (folder / (name.replace("/", "_") + ".csv")).open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", name.split("/")[-1]]
    return [(int(s), float(v)) for s, v in rows[1:]]
