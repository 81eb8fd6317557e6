"""CLI start-up: wall and CPU time of ``perseus --help`` and ``perseus show FILE``, with a bare
``python -c pass`` for reference (on a busy machine wall time is mostly waiting for a core; CPU
time is what the command itself costs).

Each command runs as ``python -m perseus.cli`` with ``PYTHONPATH`` set to a checkout; give
several ``--root`` to compare checkouts (e.g. before and after a change), the median of
``--repeat`` runs is printed.

    python benchmarks/bench_cli_startup.py
    python benchmarks/bench_cli_startup.py --root /path/to/old/checkout --root .
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run_once(argv: list[str], root: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def write_example_frontier(root: Path, path: Path) -> None:
    """A frontier file from the shipped example, written by the checkout under test."""
    subprocess.run([sys.executable, "-m", "perseus.cli", "plan", "--example", "--out", str(path)],
                   env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, action="append", help="checkout to time (default: this one); repeatable")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    roots = [r.resolve() for r in (args.root or [HERE])]
    print(f"{'checkout':40} {'command':22} {'wall (s)':>9} {'CPU (s)':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for root in roots:
            frontier = Path(tmp) / f"frontier-{abs(hash(root))}.json"
            write_example_frontier(root, frontier)
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "perseus --help": [sys.executable, "-m", "perseus.cli", "--help"],
                "perseus show FILE": [sys.executable, "-m", "perseus.cli", "show", str(frontier)],
            }
            for name, argv in commands.items():
                runs = [run_once(argv, root) for _ in range(args.repeat)]
                wall = statistics.median(w for w, _ in runs)
                cpu = statistics.median(c for _, c in runs)
                print(f"{str(root)[-40:]:40} {name:22} {wall:9.3f} {cpu:8.3f}")


if __name__ == "__main__":
    main()
