"""A whole carbon-intensity trace replayed through the real policy and forecaster: ``perseus emulate
--carbon-trace``.

The job runs through every hour of the trace. Each hour the forecaster predicts it from the hours
before, the policy picks a point from that forecast, and the hour is scored with its actual
intensity. Carbon is compared per unit of work (grams per iteration), so a slower plan that does
less work in an hour is not credited for it:

- all-max clocks: mean CI × E_max per iteration;
- a plan p_w per hour w: Σ CI_w · P_{p_w} / Σ u_{p_w} (power and rate of the hour's point);
- time change: windows / Σ (T_max / T_{p_w}) − 1, the average iteration time against all-max.

Beside the forecast-driven run: the no-slowdown point throughout, the uniform point with the same
average time as the budget, and the hindsight optimum (``policy.hindsight``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perseus.carbon.forecast import HourlyForecaster, evaluate, rolling_forecast
from perseus.carbon.policy import J_PER_KWH, CarbonPolicy, PointMenu, hindsight, time_ratio
from perseus.errors import ConfigError

WINDOW_S = 3600.0


@dataclass(frozen=True)
class CarbonReplay:
    """Per-hour intensities, forecasts and points of one replay, and its summary."""

    ci: np.ndarray
    forecast: np.ndarray
    chosen: np.ndarray
    hindsight: np.ndarray
    menu: PointMenu
    budget: float
    scale: float  # pipelines × tensor-parallel size: job power = scale × pipeline power

    def grams_per_iteration(self, chosen: np.ndarray) -> float:
        """Job-wide carbon per iteration of hours running ``chosen``."""
        m = self.menu
        carbon = np.sum(self.ci * m.powers_w[chosen]) / np.sum(m.rates[chosen])
        return float(self.scale * carbon / J_PER_KWH)

    @property
    def all_max_grams_per_iteration(self) -> float:
        return float(self.scale * np.mean(self.ci) * self.menu.baseline_energy_j / J_PER_KWH)

    def saving(self, chosen: np.ndarray) -> float:
        return 1.0 - self.grams_per_iteration(chosen) / self.all_max_grams_per_iteration

    def time_change(self, chosen: np.ndarray) -> float:
        return time_ratio(self.menu, chosen) - 1.0

    def summary(self) -> dict[str, Any]:
        m = self.menu
        default = np.full(len(self.ci), m.default_index)
        uniform_index = m.lookup(m.times_s[m.default_index] * (1.0 + self.budget))
        uniform = np.full(len(self.ci), uniform_index)
        err = evaluate(self.ci, self.forecast)
        total_kwh = float(self.scale * np.sum(m.powers_w[self.chosen]) * WINDOW_S / J_PER_KWH)
        return {
            "hours": int(len(self.ci)),
            "time_budget": self.budget,
            "carbon_saving": self.saving(self.chosen),
            "no_slowdown_carbon_saving": self.saving(default),
            "uniform_carbon_saving": self.saving(uniform),
            "hindsight_carbon_saving": self.saving(self.hindsight),
            "time_change": self.time_change(self.chosen),
            "uniform_time_change": self.time_change(uniform),
            "hindsight_time_change": self.time_change(self.hindsight),
            "forecast_mae": err.mae,
            "persistence_mae": err.persistence_mae,
            "carbon_g_per_iteration": self.grams_per_iteration(self.chosen),
            "all_max_carbon_g_per_iteration": self.all_max_grams_per_iteration,
            "energy_kwh": total_kwh,
            "carbon_t": float(self.scale * np.sum(self.ci * m.powers_w[self.chosen]) * WINDOW_S / J_PER_KWH / 1e6),
            "points_used": int(len(np.unique(self.chosen))),
            "mean_ci": float(np.mean(self.ci)),
        }


def replay_carbon(menu: PointMenu, ci: np.ndarray, first_hour_of_day: int, budget: float, scale: float = 1.0, *,
                  forecaster: Any | None = None, horizon: int = 168, lookback: int = 720) -> CarbonReplay:
    """Run the online policy over hourly intensities ``ci`` (module docstring)."""
    ci = np.asarray(ci, dtype=float)
    if len(ci) < 2:
        raise ConfigError("a carbon replay needs at least two hours of intensity")
    forecaster = HourlyForecaster() if forecaster is None else forecaster
    forecast = rolling_forecast(ci, first_hour_of_day, forecaster)
    policy = CarbonPolicy(menu, budget, horizon=horizon, lookback=lookback)
    chosen = np.empty(len(ci), dtype=int)
    for w in range(len(ci)):
        chosen[w] = policy.choose(float(forecast[w]))
        policy.observe(float(ci[w]), int(chosen[w]))
    return CarbonReplay(ci, forecast, chosen, hindsight(menu, ci, budget), menu, budget, scale)


@dataclass(frozen=True)
class PowerCapReplay:
    """Per-window power caps and the points that meet them."""

    caps_w: np.ndarray
    chosen: np.ndarray
    over: np.ndarray  # windows whose cap no point meets (the least-power point runs)
    menu: PointMenu
    scale: float

    def summary(self) -> dict[str, Any]:
        m = self.menu
        power = self.scale * m.powers_w[self.chosen]
        rate = np.sum(m.rates[self.chosen])
        all_max_rate = len(self.chosen) / m.baseline_time_s
        bound = sum(m.rate_under(c, self.scale) for c in self.caps_w)
        return {
            "windows": int(len(self.caps_w)),
            "cap_w_min": float(np.min(self.caps_w)),
            "cap_w_max": float(np.max(self.caps_w)),
            "all_max_power_w": float(self.scale * m.baseline_energy_j / m.baseline_time_s),
            "max_power_w": float(np.max(power)),
            "mean_power_w": float(np.mean(power)),
            "windows_over_cap": int(np.sum(power > self.caps_w * (1 + 1e-9))),
            "unreachable_windows": int(np.sum(self.over)),
            "throughput_loss": 1.0 - rate / all_max_rate,
            "hindsight_throughput_loss": 1.0 - bound / all_max_rate,
            "points_used": int(len(np.unique(self.chosen))),
        }


def replay_power_cap(menu: PointMenu, caps_w: np.ndarray, scale: float) -> PowerCapReplay:
    """The fastest point under each window's cap (the least-power point where none is under)."""
    caps = np.asarray(caps_w, dtype=float)
    chosen, over = np.empty(len(caps), dtype=int), np.zeros(len(caps), dtype=bool)
    cache: dict[float, int | None] = {}
    for w, cap in enumerate(caps):
        if cap not in cache:
            cache[cap] = menu.fastest_under(float(cap), scale)
        pick = cache[cap]
        over[w] = pick is None
        chosen[w] = menu.least_power() if pick is None else pick
    return PowerCapReplay(caps, chosen, over, menu, scale)
