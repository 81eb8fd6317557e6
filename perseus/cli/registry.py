"""The one table of built-in commands: the parser, its help and ``BUILTIN_COMMANDS`` derive from it.

Adding a command is one module with a ``COMMAND`` entry (``perseus.cli.common.Command``) and one
line here; the order here is the order of the help.
"""

from __future__ import annotations

from perseus.cli import clockd, doctor, emulate, export, plan, plot, report, show
from perseus.cli.common import Command

COMMANDS: tuple[Command, ...] = (
    plan.COMMAND, show.COMMAND, plot.COMMAND, export.COMMAND, emulate.COMMAND, clockd.COMMAND, report.COMMAND, doctor.COMMAND,
)
