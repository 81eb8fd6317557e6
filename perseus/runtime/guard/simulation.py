"""A synthetic deployed run for the guard's benchmark and tests: plan steps ``slowdown`` slower than
default clocks, multiplicative step noise, periodic host events, and the first step after each
clock change slower (the transient the settle steps throw away). ``simulate_energy``: a pipeline's
stages whose plan steps take as long as the probes and spend ``saving`` less energy each (negative:
more), the job's decision taken as the closed loop takes it (time verdicts and the energy test).

Why here and not in the tests: ``benchmarks/bench_guard.py`` and the tests share it, and both
must drive the guard exactly as the closed loop does (placement, windows, test, next length).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perseus.runtime.guard.job_guard import RankGuard, agree, verdict_row, with_energy
from perseus.runtime.guard.placement import ProbePlacement, ProbeTimeline
from perseus.runtime.guard.sequential import (
    Confidence,
    EnergySettings,
    EnergyTest,
    SequentialSettings,
    SequentialTest,
    job_window,
    next_length,
)

Noise = Callable[[random.Random], float]  # a step's multiplicative noise factor


def lognormal_noise(spread: float) -> Noise:
    return lambda rng: rng.lognormvariate(0.0, spread)


def trace_noise(ratios: Sequence[float]) -> Noise:
    """Noise replayed from a recorded run (each step's time over its median), at a random start."""
    values = list(ratios)

    state: dict[str, int] = {}

    def draw(rng: random.Random) -> float:
        if "i" not in state:
            state["i"] = rng.randrange(len(values))
        state["i"] = (state["i"] + 1) % len(values)
        return values[state["i"]]
    return draw


@dataclass(frozen=True)
class HostEvent:
    """Host work of ``size`` × the step time every ``period`` steps, at phase ``phase``."""

    period: int
    size: float
    phase: int = 0

    def extra(self, step: int) -> float:
        return self.size if (step + self.phase) % self.period == 0 else 0.0


@dataclass
class RunResult:
    steps: int
    default_steps: int  # deployed steps at default clocks (probe blocks)
    alarm_steps: list[int] = field(default_factory=list)  # deployed steps at which the test alarmed
    tail_default_steps: int = 0  # default-clock steps over the run's last half
    windows: int = 0

    @property
    def first_alarm(self) -> int | None:
        return self.alarm_steps[0] if self.alarm_steps else None

    @property
    def probe_share(self) -> float:
        return self.default_steps / self.steps

    @property
    def tail_probe_share(self) -> float:
        return self.tail_default_steps / (self.steps - self.steps // 2)


def simulate(steps: int, *, slowdown: float, noise: Noise, events: Sequence[HostEvent] = (), seed: int = 0,
             settings: SequentialSettings | None = None, transient: float = 0.3, stop_at_alarm: bool = True,
             deploy_step: int | None = None) -> RunResult:
    """One run of ``steps`` deployed steps; after a (false) alarm the test restarts, as after a move."""
    settings = settings or SequentialSettings()
    rng = random.Random(seed)
    deploy_step = rng.randrange(1000) if deploy_step is None else deploy_step
    timeline = ProbeTimeline(ProbePlacement(seed=rng.getrandbits(62)), settings.backoff.first)
    test = SequentialTest(settings)
    result = RunResult(steps, 0)
    plan: list[float] = []
    probe: list[float] = []
    previous_default = True  # the planning phase ran at default clocks
    for i in range(steps):
        role = timeline.role(i)
        time_s = 1.0 * noise(rng) * (1.0 + sum(e.extra(deploy_step + i) for e in events))
        if not role.default_clocks:
            time_s *= 1.0 + slowdown
        if role.default_clocks != previous_default:
            time_s *= 1.0 + transient
        previous_default = role.default_clocks
        if role.default_clocks:
            result.default_steps += 1
            result.tail_default_steps += i >= steps // 2
        if role.counted:
            (probe if role.default_clocks else plan).append(time_s)
        if i >= timeline.placement.settle and timeline.closes_window(i):
            verdict = test.observe(plan, probe)
            result.windows += 1
            plan, probe = [], []
            if verdict.confidence is Confidence.ALARM:
                result.alarm_steps.append(i)
                if stop_at_alarm:
                    result.steps = i + 1
                    return result
                test.restart()
            timeline.next(next_length(timeline.window.length, [verdict], settings.backoff))
    return result


@dataclass
class EnergyRunResult:
    steps: int  # deployed steps run (up to the drop)
    dropped_at: int | None  # the deployed step whose window's decision dropped the plan for energy
    windows: int = 0
    unmeasured_steps: int = 0  # stage-steps whose energy read None


def simulate_energy(steps: int, *, savings: Sequence[float], noise: Noise, stage_cv: float = 0.03, seed: int = 0,
                    unmeasured: float = 0.0, settings: SequentialSettings | None = None,
                    energy: EnergySettings | None = None, transient: float = 0.3,
                    bases: Sequence[float] | None = None) -> EnergyRunResult:
    """One pipeline of ``len(savings)`` stages: each stage's step energy is its base (``bases``, J; 100
    each unless given) × the step's shared ``noise`` × its own log-normal ``stage_cv``, × (1 − its
    saving) on plan steps; a stage's
    energy reads None with probability ``unmeasured``. Every stage runs a ``RankGuard`` on the same
    placement; at each window's end the rows are agreed as the closed loop agrees them. Stops at the
    energy drop."""
    settings = settings or SequentialSettings()
    rng = random.Random(seed)
    placement = ProbePlacement(seed=rng.getrandbits(62))
    guards = [RankGuard(placement, settings) for _ in savings]
    bases = list(bases) if bases is not None else [100.0] * len(savings)
    test = EnergyTest(energy or EnergySettings(threshold=settings.threshold))
    result = EnergyRunResult(steps, None)
    previous_default = True
    for i in range(steps):
        roles = [g.begin_step() for g in guards]
        default = roles[0].default_clocks
        shared = noise(rng) * (1.0 + transient if default != previous_default else 1.0)
        previous_default = default
        ends = []
        for guard, saving, base in zip(guards, savings, bases, strict=True):
            energy_j: float | None = base * shared * rng.lognormvariate(0.0, stage_cv) * (1.0 if default else 1.0 - saving)
            if rng.random() < unmeasured:
                energy_j = None
                result.unmeasured_steps += 1
            ends.append(guard.end_step(shared, energy_j))
        if ends[0] is None:
            continue
        result.windows += 1
        window = ends[0]
        decision = agree([verdict_row(0, e.verdict) for e in ends if e is not None], window.length, settings,
                         at_fastest=True)
        ranks = [e.energy for e in ends if e is not None and e.energy is not None]
        decision = with_energy(decision, test.observe(job_window(ranks)), window.length, settings)
        for guard in guards:
            guard.apply(decision)
        if decision.for_energy:
            result.steps, result.dropped_at = i + 1, i
            return result
    return result
