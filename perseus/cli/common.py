"""What every ``perseus`` command shares: its one-line errors, its output checks and its table entry.

A user error is one line ``perseus: error: ...`` (exit status 2), never a usage dump or a traceback;
an output path is checked before the work starts, so a bad ``--out`` costs nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

from perseus.errors import PerseusError

if TYPE_CHECKING:
    # argparse names what ``add_subparsers`` returns only privately; plugin commands (the
    # ``perseus.commands`` entry points) receive one and add their parser to it.
    SubParsers = argparse._SubParsersAction["OneLineParser"]


class UsageError(PerseusError):
    """Command-line arguments are missing, malformed or contradictory."""


class OneLineParser(argparse.ArgumentParser):
    """ArgumentParser whose errors become one-line ``UsageError``s (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def error_line(exc: PerseusError) -> str:
    """The error as the one stderr line the CLI prints, however many lines its message has."""
    return "perseus: error: " + " ".join(str(exc).split())


def output_file(path: Path) -> Path:
    """Fail before any work if ``path`` cannot be an output file."""
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; give a file name for --out")
    if not path.absolute().parent.is_dir():
        raise UsageError(f"{path.absolute().parent}: directory does not exist; create it first")
    return path


@dataclass(frozen=True)
class Command:
    """One built-in subcommand: its help texts, its flags and what it runs (exit status)."""

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None

    def register(self, sub: SubParsers) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.description, epilog=self.epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_arguments(p)
        p.set_defaults(handler=self.run)
