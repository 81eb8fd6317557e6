"""A frequency plan run on GPUs whose clock switches land ``latency`` after they are requested.

Why: the planner's model (``perseus.timeline.simulator``) switches the clock the instant an instruction
starts. Here every request takes ``latency`` to land, a newer request replaces one still on its
way (as the simulated GPU does, ``perseus.gpu.sim``), and a switch that lands while a kernel runs
changes the rest of it (the kernel progresses at ``1 / time(clock)`` of its work per second and
draws ``energy(clock) / time(clock)``), so this says what a plan costs under each way the runtime
can ask for its clocks (``POLICIES``):

- ``"at_begin"``: each instruction's clock when it begins (``switch_ahead`` off);
- ``"ahead"``: the next instruction's clock when the previous one ends (``switch_ahead`` on, the
  latency unknown to the runtime);
- ``"timed"``: each switch ``latency`` before its landing on the planned timeline
  (``perseus.timeline.switch_timing.request_schedule``; the runtime's latency hiding).

Several iterations run one after the other (every stage starts the next ``between_steps_s``
after the slowest has ended, as after an optimizer step), so requests made in one iteration for
the next land as they would; under ``"timed"``, those are delayed by how much longer than planned
the time between steps was in the iteration before, as the runtime does
(``perseus.runtime.clocks.deploy.TimedSwitches``). The last iteration is reported, with the same energy
accounting as the planner's (instruction energy plus P_blocking while a stage does not compute,
from the iteration's first start to its last end). With latency 0 every policy gives the
planner's numbers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.profile import Profile
from perseus.timeline.simulator import plan_costs, simulate
from perseus.timeline.switch_timing import request_schedule

POLICIES = ("at_begin", "ahead", "timed")


@dataclass(frozen=True)
class LaggedIteration:
    """One steady-state iteration of a plan under switch latency."""

    time_s: float
    energy_j: float
    start_s: np.ndarray  # per node, from the iteration's start
    finish_s: np.ndarray
    start_mhz: np.ndarray  # the clock in force when each instruction began
    off_plan_s: np.ndarray  # per node: time it ran at another clock than its planned one


class _Stage:
    """One GPU's clock: the clock in force, the request on its way, requests not made yet."""

    def __init__(self, clock: int, latency_s: float) -> None:
        self.clock = clock
        self.latency = latency_s
        self.last_asked = clock
        self.pending: tuple[float, int] | None = None  # (lands at, clock)
        self.queue: list[tuple[float, int, int]] = []  # (made at, order, clock): timed requests

    def ask(self, at: float, clock: int, order: int) -> None:
        heapq.heappush(self.queue, (at, order, clock))

    def next_event(self) -> float:
        times = [self.queue[0][0]] if self.queue else []
        if self.pending is not None:
            times.append(self.pending[0])
        return min(times, default=np.inf)

    def advance(self, until: float) -> None:
        """Apply every request made and landed up to ``until``, in time order."""
        while self.next_event() <= until:
            self.step_event()

    def step_event(self) -> None:
        made = self.queue[0][0] if self.queue else np.inf
        if self.pending is not None and self.pending[0] <= made:
            self.clock, self.pending = self.pending[1], None
            return
        at, _, clock = heapq.heappop(self.queue)
        if clock == self.last_asked:
            return
        self.last_asked = clock
        if self.latency <= 0:
            self.clock, self.pending = clock, None
        else:
            self.pending = (at + self.latency, clock)


def simulate_with_latency(dag: InstructionDAG, profile: Profile, freqs_mhz: np.ndarray, latency_s: float,
                          policy: str = "timed", *, planned: Profile | None = None,
                          iterations: int | None = None, between_steps_s: float = 0.0) -> LaggedIteration:
    """The last of ``iterations`` back-to-back iterations of ``freqs_mhz`` on ``profile``'s
    instructions, with each clock switch landing ``latency_s`` after the runtime asks for it
    under ``policy``. ``planned``: the profile the plan's timeline (hence the ``"timed"`` requests)
    comes from, when it is not the one the GPU runs (a measured profile against the true one).
    ``iterations``: 3 by default (the first has no requests from a step before), 4 with time
    between steps (the runtime measures it in the iteration before)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown request policy {policy!r}; choose one of {', '.join(POLICIES)}")
    freqs = np.asarray(freqs_mhz, dtype=np.int64)
    n, stages, offsets = dag.num_nodes, dag.schedule.num_stages, dag.stage_offsets
    schedules: list[dict[tuple[int, bool], list[tuple[float, int, bool]]]] = [{} for _ in range(stages)]
    if policy == "timed":
        durations, energies = plan_costs(dag, planned or profile, freqs)
        timeline = simulate(dag, durations, energies, (planned or profile).require_p_blocking())
        for s in range(stages):
            cut = slice(offsets[s], offsets[s + 1])
            for r in request_schedule(timeline.start_s[cut], timeline.finish_s[cut], freqs[cut], latency_s,
                                     timeline.time_s):
                schedules[s].setdefault((r.anchor, r.at_end), []).append((r.delay_s, r.clock_mhz, r.next_step))
    cost = [profile.get(int(s), inst.kind, inst.chunk) for s, inst in zip(dag.node_stage, dag.instructions)]
    gpus = [_Stage(int(freqs[offsets[s + 1] - 1]) if offsets[s + 1] > offsets[s] else 0, latency_s)
            for s in range(stages)]
    order = 0
    t0 = 0.0
    shift = 0.0  # the runtime's: measured in the iteration before (none before the first)
    result = None
    if iterations is None:
        iterations = 4 if between_steps_s > 0 else 3
    for k in range(max(int(iterations), 1)):
        start, finish = np.zeros(n), np.zeros(n)
        start_mhz, off_plan = np.zeros(n, dtype=np.int64), np.zeros(n)
        energy = 0.0
        busy = np.zeros(stages)
        for v in dag.topo_order.tolist():
            s = int(dag.node_stage[v])
            gpu, index = gpus[s], v - int(offsets[s])
            begin = max([float(finish[u]) for u in dag.predecessors[v]], default=t0)
            hooks = schedules[s]
            if policy != "timed":  # the begin hook asks for the planned clock unless asked already
                order += 1
                gpu.ask(begin, int(freqs[v]), order)
            for delay, clock, nxt in hooks.get((index, False), ()):
                order += 1
                gpu.ask(begin + delay + (shift if nxt else 0.0), clock, order)
            gpu.advance(begin)
            start[v], start_mhz[v] = begin, gpu.clock
            t, done, e = begin, 0.0, 0.0
            while True:
                time_s, energy_j = cost[v].at(gpu.clock)
                ends = t + (1.0 - done) * time_s
                event = gpu.next_event()
                if event >= ends:
                    e += (1.0 - done) * energy_j
                    if gpu.clock != freqs[v]:
                        off_plan[v] += ends - t
                    t = ends
                    break
                dt = event - t
                done += dt / time_s
                e += dt * energy_j / time_s
                if gpu.clock != freqs[v]:
                    off_plan[v] += dt
                t = event
                gpu.step_event()
            finish[v] = t
            energy += e
            busy[s] += t - begin
            if policy == "ahead":
                following = v + 1 if index + 1 < offsets[s + 1] - offsets[s] else int(offsets[s])
                order += 1
                gpu.ask(t, int(freqs[following]), order)
            for delay, clock, nxt in hooks.get((index, True), ()):
                order += 1
                gpu.ask(t + delay + (shift if nxt else 0.0), clock, order)
        t1 = float(finish.max()) if n else t0
        energy += profile.require_p_blocking() * float(((t1 - t0) - busy).sum())
        result = LaggedIteration(t1 - t0, energy, start - t0, finish - t0, start_mhz, off_plan)
        shift = between_steps_s if k > 0 else 0.0  # the gap before this iteration was measured now
        t0 = t1 + between_steps_s
    assert result is not None
    return result


__all__ = ["LaggedIteration", "POLICIES", "simulate_with_latency"]
