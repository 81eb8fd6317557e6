#!/usr/bin/env python
"""Regenerate perseus/examples/synthetic_a100_4stage.csv (the shipped example profile).

Usage: python scripts/make_example_profile.py [--out PATH]

The model (time ∝ α/f + (1−α), power = static + dynamic·(f/f_max)^2.7, heavier last stage) lives
in perseus/examples/synthetic.py; the output is deterministic and a test checks that the shipped
file equals a fresh generation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perseus.examples import example_profile_path
from perseus.examples.synthetic import example_csv_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=example_profile_path(), help="where to write the CSV")
    args = parser.parse_args()
    args.out.write_text(example_csv_text())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
