"""Carbon and power targets while training: rank 0 reads the grid, every rank switches at one step.

Why a room of its own: the grid's signals (carbon intensity, a power cap) are read from sources
that may hang or fail (``perseus.carbon.signals``), and the choice of point (``perseus.carbon.
policy``) must be the same on every rank and pipeline. So every ``grid_every_steps`` deployed
steps, on every rank at the same step boundary (``end_step``), rank 0 polls the sources and
decides, and the decision (a ``CarbonTarget`` or ``PowerCapTarget``: the point by its planned
time) is broadcast with the collective's ``broadcast_object``. Each rank hands it to
``Targeting.set_grid``; the engine switches every rank at the next step begin.

Carbon: one point per window (``carbon_window_s``); at a window's first decision the forecaster
predicts its intensity from the windows before (the live reading while there is no history) and
``CarbonPolicy`` chooses; the window's last fresh reading is its actual intensity. Power cap: at
every decision, the fastest point under the cap (``power_cap_w``, or read from
``power_cap_source``: demand response met within ``grid_every_steps`` steps). With both, the
carbon point unless its power is over the cap.

Never fatal: a source that fails answers its last good value (an intensity while not stale, a
cap always), else no carbon target (the no-slowdown point); an error is logged once per change.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from perseus.carbon.forecast import HourlyForecaster
from perseus.carbon.policy import CarbonPolicy, PointMenu
from perseus.carbon.signals import GuardedSignal, TraceSource, as_source, source_from_spec
from perseus.runtime.plane.collective import Collective
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.planner.stage_plan import StagePlan
from perseus.runtime.clocks.targeting import CarbonTarget, PowerCapTarget, Targeting

log = logging.getLogger("perseus.runtime")


@dataclass(frozen=True)
class GridDecision:
    """Rank 0's decision, broadcast: the target (None: none from the grid) and the sources' errors."""

    target: CarbonTarget | PowerCapTarget | None
    error: str | None = None


def grid_enabled(config: PerseusConfig) -> bool:
    return any(v is not None for v in (config.carbon_source, config.power_cap_w, config.power_cap_source))


class GridControl:
    """The grid's signals and policies of one rank (rank 0 decides; module docstring)."""

    def __init__(self, config: PerseusConfig, collective: Collective, job: PipelineJob,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.collective = collective
        self.enabled = grid_enabled(config)
        self.every = config.grid_every_steps
        self.scale = job.world_size / job.num_stages  # pipelines x TP: job power = scale x pipeline power
        self.steps = 0
        self.decisions: list[GridDecision] = []
        self.carbon: GuardedSignal | None = None
        self.cap: GuardedSignal | None = None
        self.clock = clock
        self._policy: CarbonPolicy | None = None
        self._menu: PointMenu | None = None
        self._forecaster = HourlyForecaster()
        self._window: int | None = None
        self._window_index: int | None = None
        self._window_ci: float | None = None
        self._last_error: str | None = None

    def open(self) -> None:
        """Rank 0 opens the sources: a bad trace or spec is a one-line error now, before training."""
        if not self.enabled or not self.collective.is_root:
            return
        c, clock = self.config, self.clock
        if c.carbon_source is not None:
            source = source_from_spec(c.carbon_source, timeout_s=c.grid_timeout_s)
            if c.carbon_replay_speed is not None and isinstance(source, TraceSource):
                start, t0, speed = float(source.trace.times[0]), clock(), c.carbon_replay_speed
                self.clock = lambda: start + (clock() - t0) * speed
            self.carbon = GuardedSignal(source, timeout_s=c.grid_timeout_s, stale_after_s=c.carbon_stale_s,
                                        clock=self.clock)
        if c.power_cap_source is not None:
            self.cap = GuardedSignal(source_from_spec(c.power_cap_source, timeout_s=c.grid_timeout_s),
                                     timeout_s=c.grid_timeout_s, stale_after_s=None, clock=self.clock)

    def use_sources(self, carbon: object = None, power_cap: object = None) -> None:
        """Python sources instead of (or besides) the config's: a callable, a Zeus
        ``CarbonIntensityProvider``, a ``SignalSource`` (``perseus.carbon.signals.as_source``).
        Call it on every rank before training (it turns the grid on, and every rank must agree);
        only rank 0 reads them."""
        c = self.config
        if carbon is not None:
            self.enabled = True
            if self.collective.is_root:
                self.carbon = GuardedSignal(as_source(carbon), timeout_s=c.grid_timeout_s,
                                            stale_after_s=c.carbon_stale_s, clock=self.clock)
        if power_cap is not None:
            self.enabled = True
            if self.collective.is_root:
                self.cap = GuardedSignal(as_source(power_cap), timeout_s=c.grid_timeout_s, stale_after_s=None,
                                         clock=self.clock)

    def end_step(self, targeting: Targeting, plan: StagePlan | None) -> GridDecision | None:
        """Called by every rank at the end of every deployed step: at the first and then every
        ``grid_every_steps``-th, rank 0's decision on every rank (a collective at that step)."""
        if not self.enabled or plan is None:
            return None
        self.steps += 1
        if (self.steps - 1) % self.every:
            return None
        decision = self.decide(plan) if self.collective.is_root else None
        decision = self.collective.broadcast_object(decision)
        self.decisions.append(decision)
        targeting.set_grid(decision.target)
        return decision

    # ---------------------------------------------------------------- rank 0

    def decide(self, plan: StagePlan) -> GridDecision:
        """Poll the sources and choose (module docstring); never raises on a source's failure."""
        if self._menu is None:
            self._menu = PointMenu.from_points([(p.time_s, p.energy_j) for p in plan.points],
                                               plan.baseline_time_s, plan.baseline_energy_j)
            c = self.config
            self._policy = CarbonPolicy(self._menu, c.carbon_time_budget, horizon=c.carbon_horizon_windows)
        menu, now, errors = self._menu, self.clock(), []
        intensity, carbon_index = None, None
        if self.carbon is not None:
            polled = self.carbon.poll(now)
            if polled.error:
                errors.append(polled.error)
            intensity = polled.value
            carbon_index = self._carbon_choice(now, intensity)
            if intensity is None:  # no usable intensity: no carbon target (the no-slowdown point)
                carbon_index = None
        cap = self.config.power_cap_w
        if self.cap is not None:
            polled = self.cap.poll(now)
            if polled.error:
                errors.append(polled.error)
            cap = polled.value
        power = self.scale * menu.powers_w
        target: CarbonTarget | PowerCapTarget | None = None
        if carbon_index is not None and (cap is None or power[carbon_index] <= cap * (1 + 1e-12)):
            under = None if cap is None else menu.fastest_under(cap, self.scale)  # the carbon point fits: not None
            target = CarbonTarget(float(menu.times_s[carbon_index]), float(intensity if intensity is not None else 0.0),
                                  float(power[carbon_index]), cap,
                                  None if under is None else float(menu.times_s[under]))
        elif cap is not None:
            index = menu.fastest_under(cap, self.scale)
            if index is None:
                index = menu.least_power()
                errors.append(f"power cap {cap:.0f} W is below the least-power point's {power[index]:.0f} W; "
                              "running that point")
            target = PowerCapTarget(float(menu.times_s[index]), float(cap), float(power[index]), intensity)
        error = "; ".join(errors) or None
        if error != self._last_error:
            if error is not None:
                log.warning("perseus: grid signal: %s", error)
            elif self._last_error is not None:
                log.info("perseus: grid signals answer again")
            self._last_error = error
        return GridDecision(target, error)

    def _carbon_choice(self, now: float, intensity: float | None) -> int | None:
        """The window's point: chosen at its first decision, kept through it."""
        assert self._policy is not None
        window = int(now // self.config.carbon_window_s)
        if window != self._window:
            if self._window is not None and self._window_ci is not None and self._window_index is not None:
                self._policy.observe(self._window_ci, self._window_index)
            self._window, self._window_index, self._window_ci = window, None, None
            history = self._policy.history
            if history:
                forecast = self._forecaster.predict(history, int(now // 3600) % 24, len(history))
                self._window_index = self._policy.choose(forecast)
        if intensity is not None:
            self._window_ci = intensity
            if self._window_index is None:  # no history yet, or no reading at the window's start
                self._window_index = self._policy.choose(intensity)
        return self._window_index

    def summary(self) -> dict[str, object] | None:
        """The summary's ``"grid"``: decisions made and the target in force."""
        if not self.enabled:
            return None
        last = self.decisions[-1] if self.decisions else None
        return {"decisions": len(self.decisions), "every_steps": self.every,
                "target": None if last is None or last.target is None else type(last.target).__name__,
                "errors": sum(d.error is not None for d in self.decisions)}

    def close(self) -> None:
        for signal in (self.carbon, self.cap):
            if signal is not None:
                signal.close()
