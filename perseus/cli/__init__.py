"""The ``perseus`` command: plan, show, plot, export, emulate, clockd, report (and ``demo``, from ``perseus_demo``).

Each subcommand is one module here (``perseus.cli.plan``, ...) holding its flags and its handler, a
thin shell over the library (planner, frontier, plot, export, emulator); ``perseus.cli.registry``
lists them. Every user error — bad arguments, unreadable or malformed files, impossible
configurations — is printed as one line ``perseus: error: ...`` on stderr with exit status 2, and
nothing is written: outputs are checked before the work starts and written atomically at the end.

Start-up stays fast: this package imports neither numpy nor the planner (scipy, HiGHS), the
emulator, matplotlib or torch; each command imports what it uses when it runs. Plugin commands
(``perseus demo``) are looked up only when the command is not a built-in one, or for the help.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Sequence

from perseus import __version__
from perseus.cli.common import OneLineParser, error_line
from perseus.cli.registry import COMMANDS
from perseus.errors import PerseusError

if TYPE_CHECKING:
    from perseus.cli.common import SubParsers

__all__ = ["BUILTIN_COMMANDS", "build_parser", "main"]

BUILTIN_COMMANDS: tuple[str, ...] = tuple(command.name for command in COMMANDS)

MAIN_EPILOG = """\
typical workflow:
  perseus plan --example --out frontier.json          # plan on the shipped example profile
  perseus show frontier.json                          # the time-energy frontier as a table
  perseus plot frontier.json --out frontier.png       # ... as a figure
  perseus plot frontier.json --timeline --out timeline.png
  perseus export frontier.json --format zeus --out zeus_freqs/
  perseus emulate --example --gpus 1024 --tp 8 --straggler-factor 1.2

your own profile (Zeus CSV: stage,instruction,frequency,time,energy):
  perseus plan --profile prof.csv --p-blocking 83.64 --stages 8 --microbatches 12 --out frontier.json

Run 'perseus COMMAND --help' for the options of each command.
"""


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The ``perseus`` parser; ``plugins=False`` leaves out the entry-point commands (no lookup)."""
    parser = OneLineParser(
        prog="perseus",
        description="Perseus: remove energy bloat from pipeline-parallel training by planning per-instruction GPU frequencies.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"perseus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    if plugins:
        _add_plugin_commands(sub)
    return parser


def _add_plugin_commands(sub: SubParsers) -> None:
    """Subcommands that other installed packages add through the ``perseus.commands`` entry points.

    Each entry point is a function taking the subparsers; its parser sets ``handler`` (namespace →
    exit status). ``perseus demo`` comes this way from ``perseus_demo``, so the library never
    imports the demo.
    """
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group="perseus.commands"), key=lambda e: e.name):
        entry.load()(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perseus`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # Looking up installed plugins scans every distribution's metadata: only worth it when the
    # command may be one of theirs, or for the help that lists them.
    parser = build_parser(plugins=not argv or argv[0] not in BUILTIN_COMMANDS)
    try:
        args = parser.parse_args(argv)
        status: int = args.handler(args)
        return status
    except PerseusError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("perseus: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. 'perseus show f.json | head': stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
