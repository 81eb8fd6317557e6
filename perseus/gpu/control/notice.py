"""``ClockNotice``: what a clock controller reports unasked, as a typed value.

Why: the controller process and ``perseus clockd`` send notices as dicts across a process
boundary (``keeper``: ``{"event": "override", ...}`` / ``{"event": "failed", ...}``); the
controllers on the trainer's side turn each into a ``ClockNotice`` at that edge
(``from_wire``), so the runtime reads fields, not dict keys.

- ``override``: a read-back found the held clock gone (``nvidia-smi -rgc``) and it was re-applied
  (``expected`` / ``found`` MHz, ``reapplied``, ``count`` of at most ``max`` times);
- ``failed``: the device refused a clock, the clock kept being changed from outside, or the
  controller went away: default clocks from now on (``message``; ``reset``: whether the reset
  was confirmed, None if unknown).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

NoticeKind = Literal["override", "failed"]
KINDS: tuple[str, ...] = ("override", "failed")
_FIELDS: dict[str, tuple[str, ...]] = {  # per kind, in the order the wire form has them
    "override": ("expected", "found", "reapplied", "count", "max"),
    "failed": ("message", "reset"),
}


@dataclass(frozen=True)
class ClockNotice:
    """One notice of a clock controller (see the module docstring for the two kinds)."""

    kind: NoticeKind
    message: str | None = None
    expected: int | None = None
    found: int | None = None
    reapplied: Any = None
    count: int | None = None
    max: int | None = None
    reset: bool | None = None

    @classmethod
    def from_wire(cls, event: dict[str, Any]) -> ClockNotice | None:
        """The notice in a controller's event dict, or None when the event is no notice."""
        kind = event.get("event")
        if kind not in KINDS:
            return None
        return cls(kind, **{name: event.get(name) for name in _FIELDS[kind]})

    @classmethod
    def failed(cls, message: str, reset: bool | None = None) -> ClockNotice:
        return cls("failed", message=message, reset=reset)

    def as_dict(self) -> dict[str, Any]:
        """The wire form (``{"event": kind, ...}``): what the metrics file's event line records."""
        return {"event": self.kind, **{name: getattr(self, name) for name in _FIELDS[self.kind]}}

    def describe(self) -> str:
        """One line for the log."""
        if self.kind == "override":
            return (f"the SM clock was changed outside Perseus (held {self.expected} MHz, read back {self.found} MHz; "
                    f"e.g. nvidia-smi -rgc); re-applied it ({self.count} of at most {self.max} times)")
        return f"clock control failed ({self.message})"
