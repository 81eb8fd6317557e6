"""The unlocked card in the planner: a choice of every kind that has one, and the reference plan.

Why: "fastest" and "no slowdown" must mean what the unlocked card does under this load, not every
instruction locked at the top clock: a locked clock above a kind's sustained clock runs at the
sustained one (the card throttles back), and locking takes the card's own boost away. So a kind
whose profile knows the unlocked card (``InstructionProfile.unlocked``) may be planned at
``UNLOCKED_MHZ`` (default clocks) with the time and energy measured there, never at a locked clock
above its sustained one (``choice_clocks``), and the no-slowdown baseline runs every such kind
unlocked (``reference_plan``). A profile without unlocked points plans as before.

A locked clock no better than the unlocked card in time and energy (within ``SAME_AS_UNLOCKED``)
is no choice either: the lock buys nothing it can measure and costs a clock switch at every
change (on the simulated H200 a plan alternating 1,980 and 1,530 MHz locks, the clocks the card
sustains anyway, ran 1.6 % slower than the unlocked card in one run).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perseus.profile import InstructionProfile, Profile
from perseus.profile.unlocked import UNLOCKED_MHZ
from perseus.schedules.dag import InstructionDAG

# A locked clock must be this much faster, or use this much less energy, than the unlocked card
# (relative) to be planned instead of it: within a fraction of the profile's noise.
SAME_AS_UNLOCKED = 0.002


def choice_clocks(entry: InstructionProfile) -> list[tuple[int, float, float]]:
    """(clock, time, energy) the planner may choose for ``entry``: its clocks up to the kind's
    sustained one (all of them where unknown) that beat the unlocked card in time or energy by
    ``SAME_AS_UNLOCKED``, and the unlocked card where measured."""
    unlocked = entry.unlocked
    clocks = list(zip(entry.freqs_mhz, entry.times_s, entry.energies_j))
    if unlocked is None:
        return clocks
    top = unlocked.sustained_mhz
    keep = 1.0 - SAME_AS_UNLOCKED
    out = [(f, t, e) for f, t, e in clocks if (top is None or f <= top)
           and (t < keep * unlocked.time_s or e < keep * unlocked.energy_j)]
    return [*out, (UNLOCKED_MHZ, unlocked.time_s, unlocked.energy_j)]


def reference_plan(dag: InstructionDAG, profile: Profile) -> np.ndarray:
    """The plan slowdowns are measured against: each instruction unlocked where its kind has an
    unlocked point, else at its highest measured clock (the all-max plan)."""
    freqs = []
    for stage, inst in zip(dag.node_stage.tolist(), dag.instructions):
        entry = profile.get(stage, inst.kind, inst.chunk)
        freqs.append(UNLOCKED_MHZ if entry.unlocked is not None else entry.freqs_mhz[0])
    return np.asarray(freqs, dtype=np.int64)


def with_unlocked_clock(profile: Profile) -> Profile:
    """``profile`` with each unlocked point also as the clock ``UNLOCKED_MHZ`` of its entry, for
    code that looks plans up in an entry's clock arrays (``perseus.timeline.simulator.plan_timelines``)."""
    if not any(e.unlocked is not None for e in profile.entries.values()):
        return profile
    entries = {key: e if e.unlocked is None or UNLOCKED_MHZ in e.freqs_mhz else
               InstructionProfile((*e.freqs_mhz, UNLOCKED_MHZ), (*e.times_s, e.unlocked.time_s),
                                  (*e.energies_j, e.unlocked.energy_j), e.unlocked)
               for key, e in profile.entries.items()}
    return replace(profile, entries=entries, quality={})
