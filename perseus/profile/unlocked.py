"""The unlocked card as a clock choice: what an instruction kind does at default clocks.

Why: an unlocked card runs each kind of work at the clock its own DVFS sustains under that load,
not at one clock per card: the measured H200 ran dense GEMMs at 1,530 MHz under its power cap and
memory-bound work at 1,980 MHz. Locking a clock above a kind's sustained clock changes nothing
(the card throttles back), and locking any clock takes away the card's own boost, so "run it as
the unlocked card does" is a choice of its own, and the reference every slowdown is measured
against: "fastest" and "no slowdown" mean what the unlocked card does under this load.

A plan names it with the clock ``UNLOCKED_MHZ`` (0: no SM clock is 0, and the GPU stream's
requests already read a clock <= 0 as default clocks); ``Unlocked`` is one kind's measurement of
it, carried by its ``InstructionProfile``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from perseus.errors import ProfileError

UNLOCKED_MHZ: Final[int] = 0  # a planned clock meaning default clocks: the card's own DVFS, no lock
UNLOCKED_NAME: Final[str] = "unlocked"  # how files and messages spell it


def is_unlocked(mhz: int) -> bool:
    """Whether a planned clock is the unlocked card (default clocks) rather than a locked clock."""
    return mhz == UNLOCKED_MHZ


def clock_name(mhz: int) -> str:
    """A planned clock as people read it: ``"1410 MHz"`` or ``"unlocked"``."""
    return UNLOCKED_NAME if is_unlocked(mhz) else f"{mhz} MHz"


@dataclass(frozen=True)
class Unlocked:
    """One instruction kind on the unlocked card under the job's load: the clock the card
    sustained under it (None: unknown) and the instruction's time (s) and energy (J) there."""

    time_s: float
    energy_j: float
    sustained_mhz: int | None = None

    def __post_init__(self) -> None:
        for what, value in (("time", self.time_s), ("energy", self.energy_j)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ProfileError(f"the unlocked {what} must be a positive finite number, got {value!r}")
        if self.sustained_mhz is not None and (not isinstance(self.sustained_mhz, int) or self.sustained_mhz <= 0):
            raise ProfileError(f"a sustained clock must be a positive integer (MHz), got {self.sustained_mhz!r}")
        object.__setattr__(self, "time_s", float(self.time_s))
        object.__setattr__(self, "energy_j", float(self.energy_j))
