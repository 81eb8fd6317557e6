"""Command-line interface (placeholder until the CLI lands)."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("perseus: CLI not implemented yet", file=sys.stderr)
    return 2
