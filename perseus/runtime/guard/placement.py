"""Where the probe blocks go: one per window, at a pseudo-random offset no training loop can lock onto.

Why not a fixed phase: training loops have periods of their own (a data loader that recreates its
iterator every epoch of 2 or 4 steps, logging every 10, evaluation every 50, a checkpoint every 100).
A probe at a fixed phase of a fixed period lands on the same phase of such a loop every time, so
every probe either always or never pays for the periodic host work, and the A/B is biased by it
in a direction set by whether the deploy step was even or odd. Here deployed steps are cut into
windows, and each window's probe block starts at an offset drawn uniformly from the positions the
window allows. Whatever the loop's period, a probe then pays the periodic work with the same
probability as a plan step of the window, so probe and plan steps are exchangeable under an
honest plan, the assumption the sequential test (``sequential.py``) is exact under.

Why a seed and no collective: the offset is a hash of (seed, window index), and the seed comes
from what every rank already agrees on (the deploy step and the plan's fingerprint), so every rank
computes the same probe steps without a message.

Layout of one window of ``length`` steps whose block starts at offset ``o`` (``settle`` = 1,
``counted`` = 1)::

    offset:  0 ..  o-1   o        o+1     o+2       o+3 .. length-1
    role:    plan        probe~   probe   plan~     plan
             (~: settle step, not counted)

``o`` is uniform on ``0 .. length − block − settle − 1``, so at least one counted plan step
follows the block's plan-settle step in the same window. Each window is longer than asked by a
seeded jitter of up to an eighth, so windows start at every phase of any period too. Window
lengths are chosen by the sequential test as it goes (short while it is unsure, longer as
confidence grows, see ``Backoff``), always before the window begins.

Pure: roles are a function of the seed, the window lengths and the step index.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass

from perseus.errors import ConfigError

JITTER = 0x5EED  # mixes the seed for window lengths apart from block offsets


class StepRole(enum.Enum):
    """What a deployed step is for. Settle steps follow a clock change and are not counted: the first
    iteration after a change is systematically slower (profiling saw 25-35 % on a loaded CPU; on a GPU
    the clock, caches and the allocator settle), so every counted sample, plan or probe, follows
    ``settle`` steps at its own clocks and the transient enters neither side."""

    PLAN = "plan"  # planned clocks, counted
    PLAN_SETTLE = "plan_settle"  # planned clocks, first step(s) after a clock change: not counted
    PROBE_SETTLE = "probe_settle"  # the probe's clocks, first step(s) of a block: not counted
    PROBE = "probe"  # the probe's clocks, counted

    @property
    def default_clocks(self) -> bool:
        """Runs at the probe's clocks (default clocks, or a target's reference point; the metrics file
        marks it ``"clocks": "default"``)."""
        return self in (StepRole.PROBE, StepRole.PROBE_SETTLE)

    @property
    def counted(self) -> bool:
        """Its time and energy enter the A/B and the test (it was preceded by steps at its own clocks)."""
        return self in (StepRole.PLAN, StepRole.PROBE)


def clocks_label(role: StepRole) -> str:
    """The metrics file's ``"clocks"`` field: ``"default"`` for probe steps, ``"plan"`` otherwise."""
    return "default" if role.default_clocks else "plan"


def probe_seed(deploy_step: int, fingerprint: str) -> int:
    """A seed every rank derives alike: the step the job deployed at and its plan's fingerprint."""
    digest = hashlib.blake2b(f"perseus-probes:{deploy_step}:{fingerprint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def uniform_offset(seed: int, index: int, span: int) -> int:
    """Offset in ``0 .. span − 1`` for window ``index``: the same on every rank, independent across windows."""
    if span < 1:
        raise ValueError(f"span must be >= 1, got {span}")
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % span  # 2^64 values: the modulo bias is below 1e-16


@dataclass(frozen=True)
class Backoff:
    """Window lengths: ``first`` steps while the test is unsure, ×``growth`` after each window that
    leaves it confident, at most ``longest`` (a block of 2 in 200 steps is 1 % of deployed steps)."""

    first: int = 6
    growth: float = 2.0
    longest: int = 200

    def __post_init__(self) -> None:
        if self.first < 1 or self.longest < self.first:
            raise ConfigError(f"probe windows need 1 <= first ({self.first}) <= longest ({self.longest})")
        if self.growth < 1.0:
            raise ConfigError(f"probe window growth must be >= 1, got {self.growth}")

    def grow(self, length: int) -> int:
        return min(self.longest, max(length + 1, math.ceil(length * self.growth)))


@dataclass(frozen=True)
class ProbeWindow:
    """One window: deployed steps ``start .. start + length − 1`` with one probe block inside."""

    index: int
    start: int
    length: int
    block_at: int  # offset of the block's first step within the window
    settle: int
    counted: int  # counted default-clock steps per block
    lead: int = 0  # plan-settle steps first: the window follows a clock change (a guard move)

    @property
    def end(self) -> int:
        """The first step after the window."""
        return self.start + self.length

    @property
    def block(self) -> int:
        return self.settle + self.counted

    def role(self, step: int) -> StepRole:
        offset = step - self.start
        if not 0 <= offset < self.length:
            raise ValueError(f"step {step} is outside window {self.index} ({self.start}..{self.end - 1})")
        if offset < self.lead:
            return StepRole.PLAN_SETTLE
        if offset < self.block_at:
            return StepRole.PLAN
        if offset < self.block_at + self.settle:
            return StepRole.PROBE_SETTLE
        if offset < self.block_at + self.block:
            return StepRole.PROBE
        if offset < self.block_at + self.block + self.settle:
            return StepRole.PLAN_SETTLE
        return StepRole.PLAN

    @property
    def counted_plan_steps(self) -> int:
        return self.length - self.lead - self.block - self.settle

    @property
    def default_fraction(self) -> float:
        return self.block / self.length


@dataclass(frozen=True)
class ProbePlacement:
    """Windows and their blocks from a seed (module docstring)."""

    seed: int
    settle: int = 1
    counted: int = 1

    def __post_init__(self) -> None:
        if self.settle < 0 or self.counted < 1:
            raise ConfigError(f"probe blocks need settle >= 0 and counted >= 1, got {self.settle} and {self.counted}")

    def shortest(self, lead: int = 0) -> int:
        """Smallest window: leading settle steps, the block, its plan-settle step and one counted plan step."""
        return lead + self.settle + self.counted + self.settle + 1

    def window(self, index: int, start: int, length: int, lead: int = 0) -> ProbeWindow:
        """Window ``index`` from deployed step ``start``: ``length`` steps plus a jitter of up to a
        quarter of them, so windows begin at every phase of any loop period (a fixed length would
        leave the block's reachable positions at a fixed phase of a period that divides it)."""
        if length < self.shortest(lead):
            raise ConfigError(f"a probe window of {length} steps leaves no counted plan step; "
                              f"use >= {self.shortest(lead)}")
        length += uniform_offset(self.seed ^ JITTER, index, length // 8 + 1)
        span = length - lead - (self.settle + self.counted) - self.settle  # offsets keeping a counted plan step after
        block_at = lead + uniform_offset(self.seed, index, span)
        return ProbeWindow(index, start, length, block_at, self.settle, self.counted, lead)


class ProbeTimeline:
    """The deployed steps' roles, one window at a time: the first ``settle`` steps settle after the
    planning phase's default clocks, then windows whose lengths the caller sets before each begins."""

    def __init__(self, placement: ProbePlacement, first_length: int) -> None:
        self.placement = placement
        self.window = placement.window(0, placement.settle, first_length)

    def role(self, step: int) -> StepRole:
        """Role of deployed step ``step`` (steps are asked in order; a new window must be opened with
        ``next`` once ``step`` passes the current one)."""
        if step < 0:
            raise ValueError(f"deployed step must be >= 0, got {step}")
        if step < self.placement.settle:
            return StepRole.PLAN_SETTLE
        return self.window.role(step)

    def closes_window(self, step: int) -> bool:
        """``step`` is the last of its window: the test checks there and picks the next length."""
        return step == self.window.end - 1

    def next(self, length: int, *, after_move: bool = False) -> ProbeWindow:
        """Open the window after the current one, ``length`` steps long; ``after_move``: the clocks
        changed at its start (a guard move), so its first ``settle`` steps are not counted."""
        lead = self.placement.settle if after_move else 0
        length = max(length, self.placement.shortest(lead))  # a move's settle steps lengthen the shortest window
        self.window = self.placement.window(self.window.index + 1, self.window.end, length, lead)
        return self.window
