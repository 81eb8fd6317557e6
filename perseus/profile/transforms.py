"""Profiles derived from a measured one, each an assumption a measured profile makes unnecessary:
chunks as even shares of a stage (``split_into_chunks``), zero-bubble's I and W as shares of a
full backward (``split_backward``), and overlapped schedules' fused units as forward plus
backward (``fuse_forward_backward``). A derived profile names its derivation in ``source`` and
drops ``quality``, which described the measured points only.
"""

from __future__ import annotations

from dataclasses import replace

from perseus.errors import ProfileError
from perseus.profile.model import InstructionProfile, Profile
from perseus.schedules import FUSED, SPLIT_BACKWARD, Schedule


def split_into_chunks(profile: Profile, num_chunks: int) -> Profile:
    """Each stage's layers divided evenly over ``num_chunks`` chunks: every chunk-0 measurement's
    time and energy divided by ``num_chunks`` (an assumption, for comparing schedules on one
    profile; measured chunk profiles are better)."""
    if num_chunks < 1:
        raise ProfileError(f"number of chunks must be positive, got {num_chunks}")
    entries = {
        (stage, chunk, kind): InstructionProfile(p.freqs_mhz, tuple(t / num_chunks for t in p.times_s),
                                                 tuple(e / num_chunks for e in p.energies_j))
        for (stage, c0, kind), p in profile.entries.items() if c0 == 0
        for chunk in range(num_chunks)
    }
    return replace(profile, entries=entries, source=f"{profile.source} (split into {num_chunks} chunks)", quality={})


def split_backward(profile: Profile, input_share: float = 0.5) -> Profile:
    """Zero-bubble's I and W derived from each full backward B: I gets ``input_share`` of B's time
    and energy at every clock, W the rest (an assumption: the split is not measured). Profiles
    that already have I/W are returned unchanged."""
    if not 0.0 < input_share < 1.0:
        raise ProfileError(f"the input-gradient share of a backward must be between 0 and 1, got {input_share}")
    if any(kind in SPLIT_BACKWARD for _, _, kind in profile.entries):
        return profile
    entries = dict(profile.entries)
    for (stage, chunk, kind), p in profile.entries.items():
        if kind == "backward":
            for split, share in (("backward_input", input_share), ("backward_weight", 1.0 - input_share)):
                entries[(stage, chunk, split)] = InstructionProfile(
                    p.freqs_mhz, tuple(t * share for t in p.times_s), tuple(e * share for e in p.energies_j))
    return replace(profile, entries=entries, source=f"{profile.source} (I/W = {input_share:g}/{1 - input_share:g} of B)",
                   quality={})


def fuse_forward_backward(profile: Profile, schedule: Schedule) -> Profile:
    """The fused forward+backward units of ``schedule`` derived from ``profile``'s parts: at every
    clock, a unit keyed (stage, forward's chunk) costs its forward plus the mean, over the units of
    that key in the schedule, of their backward (time and energy).

    Why a sum: torch 2.13's ``ScheduleDualPipeV`` runs an ``OVERLAP_F_B`` action's forward and
    backward one after the other, so the unit is their sum as executed. megatron-core's combined
    1F1B on GPUs hides the expert all-to-all of one part behind the other's compute, so there the
    sum is an upper bound: measure the units (online profiling does) for a real job. Profiles
    that measure fused units already, and schedules without them, are returned unchanged.
    """
    if any(kind == FUSED for _, _, kind in profile.entries):
        return profile
    partners: dict[tuple[int, int], list[int]] = {}
    for stage, order in enumerate(schedule.stages):
        for inst in order:
            if inst.kind == FUSED:
                partners.setdefault((stage, inst.chunk), []).append(inst.backward_chunk or 0)
    if not partners:
        return profile
    entries = dict(profile.entries)
    for (stage, chunk), backward_chunks in sorted(partners.items()):
        forward = profile.get(stage, "forward", chunk)
        backwards = [profile.get(stage, "backward", c) for c in backward_chunks]
        if any(b.freqs_mhz != forward.freqs_mhz for b in backwards):
            raise ProfileError(f"{profile.source}: stage {stage} forward and backward were measured at different "
                               "clocks; cannot derive its fused forward+backward units from them")
        n = len(backwards)
        entries[(stage, chunk, FUSED)] = InstructionProfile(
            forward.freqs_mhz,
            tuple(t + sum(b.times_s[i] for b in backwards) / n for i, t in enumerate(forward.times_s)),
            tuple(e + sum(b.energies_j[i] for b in backwards) / n for i, e in enumerate(forward.energies_j)))
    return replace(profile, entries=entries, source=f"{profile.source} (fused F+B = F + B)", quality={})
