"""Which frontier point to run in a window: carbon-aware under a time budget, or under a power cap.

The frontier's points as rates: point p does u_p = 1/T_p iterations per second at power
P_p = E_p/T_p (one pipeline, one tensor-parallel rank per stage; a job of N GPUs and S stages
runs N/S such pipelines, so its power is N/S × P_p).

**Carbon.** A job has a fixed amount of work and may take ``budget`` longer on average than at
the no-slowdown point (e.g. +2.5 % over a day). In a window of intensity CI, running p costs
CI × P_p grams per second and does u_p work per second. The Lagrangian of "least carbon for the
work, within the time" splits into windows: each runs the point minimising
(CI·E_p − λ)/T_p = CI·P_p − λ·u_p, λ being the price of work (grams per iteration). That
minimiser is a vertex of the lower convex hull of the points (u_p, P_p), and as CI only scales
P it is the same hull for every window: the vertex is found by comparing λ/CI with the hull's
slopes (``PointMenu.choose``). Points off the hull are never the best choice in any window.

λ online (``CarbonPolicy``): from the last week's intensities, the λ whose choices would have met
the time ratio still allowed (the budget, less the time already used over it, spread over the
next ``horizon`` windows); the window's point then follows the forecast intensity. In hindsight
(``hindsight``): one λ for the whole trace, the least that keeps the average within the budget.

**Power cap.** The fastest point whose job power (N/S × P_p) is at or under the cap
(``PointMenu.fastest_under``). A cap changed at runtime is met from the next decision.
Its fractional bound (``PointMenu.rate_under``): the hull interpolated to the cap exactly, i.e. a
mix of two points within a window, which no per-window choice beats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from perseus.errors import ConfigError

if TYPE_CHECKING:
    from perseus.frontier.model import Frontier

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class PointMenu:
    """Frontier points as (time, energy) per pipeline iteration, fastest first, with the all-max
    baseline; ``hull``: indices of the lower convex hull of (rate, power), slowest first."""

    times_s: np.ndarray
    energies_j: np.ndarray
    baseline_time_s: float
    baseline_energy_j: float
    hull: np.ndarray = field(init=False)
    slopes: np.ndarray = field(init=False)

    @classmethod
    def from_points(cls, points: Sequence[tuple[float, float]], baseline_time_s: float,
                    baseline_energy_j: float) -> PointMenu:
        if not points:
            raise ConfigError("a point menu needs at least one frontier point")
        t = np.array([p[0] for p in points], dtype=float)
        e = np.array([p[1] for p in points], dtype=float)
        if np.any(t <= 0) or np.any(e <= 0):
            raise ConfigError("frontier points need positive times and energies")
        return cls(t, e, float(baseline_time_s), float(baseline_energy_j))

    @classmethod
    def from_frontier(cls, frontier: Frontier) -> PointMenu:
        """From a frontier's own-pace points."""
        points = [(p.time_s, p.energy_j) for p in frontier.points]
        return cls.from_points(points, frontier.baseline_time_s, frontier.baseline_energy_j)

    def __post_init__(self) -> None:
        rate, power = 1.0 / self.times_s, self.energies_j / self.times_s
        order = np.lexsort((power, rate))  # by rate, then power
        hull: list[int] = []
        for i in order:
            if hull and rate[i] == rate[hull[-1]]:
                continue  # same rate, more power
            while len(hull) >= 2:
                a, b = hull[-2], hull[-1]
                cross = (rate[b] - rate[a]) * (power[i] - power[a]) - (power[b] - power[a]) * (rate[i] - rate[a])
                if cross <= 0:  # b is on or above the segment a-i
                    hull.pop()
                else:
                    break
            hull.append(int(i))
        # keep the part where more rate costs more power (slower points with more power never win)
        start = int(np.argmin(power[hull]))
        hull = hull[start:]
        h = np.array(hull, dtype=int)
        slopes = np.diff(power[h]) / np.diff(rate[h]) if len(h) > 1 else np.zeros(0)
        object.__setattr__(self, "hull", h)
        object.__setattr__(self, "slopes", slopes)

    @property
    def rates(self) -> np.ndarray:
        return 1.0 / self.times_s

    @property
    def powers_w(self) -> np.ndarray:
        return self.energies_j / self.times_s

    @property
    def default_index(self) -> int:
        """The no-slowdown point: least energy no slower than the baseline (fastest if none is)."""
        fits = np.nonzero(self.times_s <= self.baseline_time_s * (1 + 1e-12))[0]
        if len(fits) == 0:
            return int(np.argmin(self.times_s))
        return int(fits[np.argmin(self.energies_j[fits])])

    def choose(self, ci: np.ndarray | float, price: float) -> np.ndarray:
        """Point index per window minimising CI·P − price·u (module docstring); ``price`` in
        grams per iteration, ``ci`` in gCO2/kWh."""
        ci = np.atleast_1d(np.asarray(ci, dtype=float))
        ratio = price * J_PER_KWH / np.maximum(ci, 1e-9)  # λ/CI in W·s = J per iteration
        k = np.searchsorted(self.slopes, ratio, side="left")
        return self.hull[k]

    def lookup(self, max_time_s: float) -> int:
        """Least-energy point no slower than ``max_time_s`` (fastest if none is)."""
        fits = np.nonzero(self.times_s <= max_time_s * (1 + 1e-12))[0]
        if len(fits) == 0:
            return int(np.argmin(self.times_s))
        return int(fits[np.argmin(self.energies_j[fits])])

    def fastest_under(self, cap_w: float, scale: float) -> int | None:
        """The fastest point whose job power (``scale`` × pipeline power) is at or under ``cap_w``;
        None when even the least-power point is over it."""
        fits = np.nonzero(scale * self.powers_w <= cap_w * (1 + 1e-12))[0]
        if len(fits) == 0:
            return None
        return int(fits[np.argmin(self.times_s[fits])])

    def least_power(self) -> int:
        return int(np.argmin(self.powers_w))

    def rate_under(self, cap_w: float, scale: float) -> float:
        """The most iterations per second at job power ``cap_w`` mixing two hull points in a
        window (the cap met on the window's average); the least power's rate if below it."""
        rate, power = self.rates[self.hull], scale * self.powers_w[self.hull]
        if cap_w >= power[-1]:
            return float(rate[-1])
        if cap_w <= power[0]:
            return float(rate[0])
        return float(np.interp(cap_w, power, rate))


def time_ratio(menu: PointMenu, chosen: np.ndarray) -> float:
    """Average iteration time over equal windows running ``chosen``, in baseline times: windows
    / work, work being each window's iterations at its point."""
    return float(len(chosen) / np.sum(menu.baseline_time_s / menu.times_s[chosen]))


def price_for_ratio(menu: PointMenu, ci: np.ndarray, ratio: float, iterations: int = 60) -> float:
    """The least price (grams per iteration) whose choices over windows of intensity ``ci`` keep
    the average iteration time at or under ``ratio`` baseline times (bisection; choices only get
    faster as the price rises)."""
    ci = np.asarray(ci, dtype=float)
    if time_ratio(menu, menu.choose(ci, 0.0)) <= ratio:
        return 0.0
    high = float(np.max(ci)) * float(np.max(menu.slopes, initial=1.0)) / J_PER_KWH * 4 + 1e-6
    while time_ratio(menu, menu.choose(ci, high)) > ratio and high < 1e12:
        high *= 4
    low = 0.0
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        if time_ratio(menu, menu.choose(ci, mid)) > ratio:
            low = mid
        else:
            high = mid
    return high


def hindsight(menu: PointMenu, ci: np.ndarray, budget: float) -> np.ndarray:
    """Per-window points with the whole trace known: one price, the least within the budget."""
    ratio = (1.0 + budget) * menu.times_s[menu.default_index] / menu.baseline_time_s
    return menu.choose(ci, price_for_ratio(menu, ci, ratio))


class CarbonPolicy:
    """Online carbon-aware choice, one window at a time (module docstring).

    ``choose(forecast)`` picks the coming window's point from its forecast intensity;
    ``observe(actual, index)`` records the window that ended (its actual intensity and the point run).
    """

    def __init__(self, menu: PointMenu, budget: float, *, horizon: int = 168, lookback: int = 720) -> None:
        if not 0.0 <= budget <= 1.0:
            raise ConfigError(f"carbon time budget must be a fraction in [0, 1] (0.025 = +2.5 %), got {budget!r}")
        if horizon < 1 or lookback < 1:
            raise ConfigError("carbon policy: horizon and lookback must be at least one window")
        self.menu = menu
        self.budget = float(budget)
        self.horizon = horizon
        self.lookback = lookback
        self.history: list[float] = []
        self.windows = 0
        self.work = 0.0  # windows' work in baseline iterations per baseline time
        self.default = menu.default_index
        self.target = (1.0 + budget) * menu.times_s[self.default] / menu.baseline_time_s
        self.slowest_ratio = float(menu.times_s[menu.hull[0]] / menu.baseline_time_s)
        self.price = 0.0

    def allowed_ratio(self) -> float:
        """The average time ratio the next ``horizon`` windows may run at so the whole run so far
        plus them meets the budget."""
        k = self.horizon
        room = (self.windows + k) / self.target - self.work
        if room <= 0:
            return 1.0
        return float(np.clip(k / room, 1.0, self.slowest_ratio))

    def choose(self, forecast_ci: float) -> int:
        """The point for the coming window (an index into the menu)."""
        if self.budget == 0.0:
            return self.default
        recent = np.array(self.history[-self.lookback:] or [forecast_ci])
        self.price = price_for_ratio(self.menu, recent, self.allowed_ratio(), iterations=40)
        return int(self.menu.choose(forecast_ci, self.price)[0])

    def observe(self, actual_ci: float, index: int) -> None:
        self.history.append(float(actual_ci))
        self.windows += 1
        self.work += float(self.menu.baseline_time_s / self.menu.times_s[index])
