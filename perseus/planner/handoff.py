"""The hand-off between a stage's instructions, calibrated on the measured all-max step.

Why: the instruction DAG charges nothing between one instruction's end and the next one's begin,
but handing work from stage to stage costs time: the framework's send and receive, the receiver's
wake-up and its host code between instructions (0.5–1.5 ms per instruction on this 2-core CPU's
simulated pipelines; a P2P transfer on GPUs). A plan that spends all of the planned slack then
puts chains of hand-offs on the critical path and runs slower than planned: the asynchronous
Megatron demo +1.3–1.6 %, the unpadded DeepSpeed script +6–9 % (its guard fell back).

The model: every instruction whose output another stage waits for (``sending_keys``: a forward
that feeds the next stage, a backward that feeds the previous one) takes ``handoff_s`` longer at
every clock, with the GPU idle meanwhile (energy ``handoff_s × P_blocking``), so an option's cost
``e − P_blocking·t`` is unchanged and only the schedule's timing moves; the sender's own next
instruction waits too, as it does where the send is the host's. ``calibrate_handoff`` finds the
``handoff_s`` at which the all-max plan's makespan is the measured one (bisection: the makespan
is increasing in it). Charged to the senders, not to every instruction: the time is in the
hand-off, and a plan that slows a stage feeding the bottleneck puts a chain of hand-offs on the
critical path that the all-max path (mostly the bottleneck stage's own instructions) has few of
(a constant on every instruction, tried first, left the asynchronous Megatron demo at +1.4 %).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

from perseus.errors import PerseusError
from perseus.profile import InstructionProfile, Profile
from perseus.profile.model import ProfileKey
from perseus.schedules import Schedule
from perseus.schedules.dag import InstructionDAG
from perseus.planner.unlocked import reference_plan
from perseus.timeline.simulator import simulate_plan

ITERATIONS = 40  # bisection steps: the interval shrinks 2^40-fold, far below a microsecond
MIN_EXCESS = 0.002  # a measured step within this fraction of the model's needs no hand-off
# At most this share of the shortest sender's max-clock time: a longer "hand-off" is a warm-up step
# that stalled on something else (start-up, a collection, another process: one toy run on a busy
# machine read 35 ms against 10 ms instructions), and believing it would plan slack the job lacks.
MAX_SHARE = 0.5


def sending_keys(schedule: Schedule) -> frozenset[ProfileKey]:
    """``(stage, chunk, kind)`` of the instructions another stage waits for (the DAG's cross-stage edges)."""
    dag = InstructionDAG.from_schedule(schedule)
    stages = dag.node_stage.tolist()
    return frozenset((stages[u], dag.instructions[u].chunk, dag.instructions[u].kind)
                     for u, v in zip(dag.edge_src.tolist(), dag.edge_dst.tolist()) if stages[u] != stages[v])


def with_handoff(profile: Profile, handoff_s: float, senders: Collection[ProfileKey]) -> Profile:
    """``profile`` with the ``senders``' entries ``handoff_s`` longer at every clock (and unlocked),
    idle at P_blocking."""
    if handoff_s < 0 or not math.isfinite(handoff_s):
        raise PerseusError(f"a hand-off time is seconds >= 0, got {handoff_s!r}")
    if handoff_s == 0:
        return profile
    idle_j = handoff_s * profile.require_p_blocking()
    entries = {key: InstructionProfile(e.freqs_mhz, tuple(t + handoff_s for t in e.times_s),
                                       tuple(j + idle_j for j in e.energies_j),
                                       None if e.unlocked is None else
                                       replace(e.unlocked, time_s=e.unlocked.time_s + handoff_s,
                                               energy_j=e.unlocked.energy_j + idle_j)) if key in senders else e
               for key, e in profile.entries.items()}
    return replace(profile, entries=entries)


def calibrate_handoff(schedule: Schedule, profile: Profile, measured_s: float) -> float:
    """The hand-off per instruction that makes the all-max makespan (``reference_plan``: the
    unlocked card where the profile knows it, as warm-up ran) ``measured_s`` (0 when the
    model is within ``MIN_EXCESS`` of it or above it: a profile's pessimism is not a hand-off; at
    most ``MAX_SHARE`` of the shortest sender's time)."""
    if measured_s <= 0 or not math.isfinite(measured_s):
        raise PerseusError(f"a measured step time is seconds > 0, got {measured_s!r}")
    dag = InstructionDAG.from_schedule(schedule)
    freqs = reference_plan(dag, profile)
    senders = sending_keys(schedule)
    if not senders:  # one stage: nothing is handed off
        return 0.0

    def makespan(h: float) -> float:
        return simulate_plan(dag, with_handoff(profile, h, senders), freqs).time_s

    if makespan(0.0) >= measured_s * (1.0 - MIN_EXCESS):
        return 0.0
    per_stage = max(len(instructions) for instructions in schedule.stages)
    cap = MAX_SHARE * min(profile.entries[key].times_s[0] for key in senders if key in profile.entries)
    if makespan(cap) <= measured_s:
        return cap
    low, high = 0.0, min(cap, measured_s / per_stage)  # a stage's instructions alone would fill the step
    for _ in range(ITERATIONS):
        mid = (low + high) / 2
        if makespan(mid) < measured_s:
            low = mid
        else:
            high = mid
    return low
