"""The carbon and power-cap policies on hand-made menus, and the forecaster against persistence."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.carbon.forecast import HourlyForecaster, PersistenceForecaster, evaluate, rolling_forecast
from perseus.carbon.policy import CarbonPolicy, PointMenu, hindsight, price_for_ratio, time_ratio
from perseus.carbon.replay import replay_carbon, replay_power_cap
from perseus.errors import ConfigError

# (time s, energy J), fastest first; baseline 1.0 s, 1000 J. Powers: 900, 820, 880 (off the hull:
# more power than the faster 1.05 point), 760, 700.
POINTS = [(1.00, 900.0), (1.05, 861.0), (1.08, 950.4), (1.10, 836.0), (1.20, 840.0)]


@pytest.fixture
def menu() -> PointMenu:
    return PointMenu.from_points(POINTS, 1.0, 1000.0)


def test_hull_drops_points_that_never_win(menu):
    assert 2 not in menu.hull.tolist()  # 880 W at less rate than the 820 W point
    assert menu.hull.tolist() == [4, 3, 1, 0]  # slowest first
    assert np.all(np.diff(menu.slopes) > 0)  # convex
    assert menu.default_index == 0
    # price 0: least power; a huge price: the fastest
    assert menu.choose(300.0, 0.0)[0] == 4
    assert menu.choose(300.0, 1e6)[0] == 0
    # choose() minimises CI·P − price·u over all points, brute force agrees
    for ci in (50.0, 200.0, 500.0):
        for price in np.linspace(0, 0.5, 41):
            cost = ci * menu.powers_w / 3.6e6 - price * menu.rates
            assert cost[menu.choose(ci, price)[0]] == pytest.approx(cost.min())


def test_hindsight_meets_the_budget_and_moves_slowdown_to_dirty_hours(menu):
    ci = np.tile([100.0, 100.0, 400.0, 400.0], 50)
    chosen = hindsight(menu, ci, 0.10)
    assert time_ratio(menu, chosen) <= 1.10 + 1e-9
    assert np.all(menu.times_s[chosen[ci == 400.0]] >= menu.times_s[chosen[ci == 100.0]].max())
    # beats the uniform point of the same average time on carbon per unit of work
    uniform = menu.lookup(1.10)
    carbon = np.sum(ci * menu.powers_w[chosen]) / np.sum(menu.rates[chosen])
    assert carbon < np.mean(ci) * menu.energies_j[uniform]


def test_price_for_ratio_is_the_least_price_within_the_ratio(menu):
    ci = np.linspace(100, 400, 48)
    price = price_for_ratio(menu, ci, 1.07)
    assert time_ratio(menu, menu.choose(ci, price)) <= 1.07
    assert time_ratio(menu, menu.choose(ci, price * 0.999)) > 1.07
    assert price_for_ratio(menu, ci, 2.0) == 0.0


def test_online_policy_holds_its_budget_and_saves_more_than_uniform(menu):
    hours = np.arange(24 * 60)
    ci = 250 + 120 * np.sin(2 * np.pi * hours / 24) + 30 * np.sin(2 * np.pi * hours / (24 * 7))
    replay = replay_carbon(menu, ci, 0, 0.08, scale=4.0, forecaster=PersistenceForecaster(), horizon=24,
                           lookback=168)
    summary = replay.summary()
    assert summary["time_change"] <= 0.08 + 0.001
    assert summary["carbon_saving"] > summary["uniform_carbon_saving"]
    assert summary["hindsight_carbon_saving"] >= summary["carbon_saving"] - 1e-9
    assert summary["no_slowdown_carbon_saving"] == pytest.approx(1 - 900 / 1000)


def test_zero_budget_is_no_slowdown_and_bad_budgets_are_refused(menu):
    policy = CarbonPolicy(menu, 0.0)
    assert {policy.choose(c) for c in (50.0, 500.0)} == {menu.default_index}
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="time budget"):
            CarbonPolicy(menu, bad)


def test_power_cap_picks_the_fastest_point_under_it(menu):
    # scale 10: job powers 9000, 8200, 8800, 7600, 7000 W
    assert menu.fastest_under(9000.0, 10) == 0
    assert menu.fastest_under(8600.0, 10) == 1
    assert menu.fastest_under(8000.0, 10) == 3
    assert menu.fastest_under(6000.0, 10) is None
    # the fractional bound interpolates the hull between 7600 W (rate 1/1.1) and 8200 W (1/1.05)
    assert menu.rate_under(8050.0, 10) == pytest.approx(1 / 1.1 + 0.75 * (1 / 1.05 - 1 / 1.1))


def test_demand_response_caps_are_met_every_window(menu):
    caps = np.array([9500.0] * 5 + [8000.0] * 3 + [8600.0] * 4 + [6000.0])
    replay = replay_power_cap(menu, caps, 10)
    summary = replay.summary()
    power = 10 * menu.powers_w[replay.chosen]
    assert np.all(power[:-1] <= caps[:-1])
    assert summary["windows_over_cap"] == 1 and summary["unreachable_windows"] == 1  # 6000 W: nothing fits
    assert replay.chosen[-1] == menu.least_power()
    assert summary["hindsight_throughput_loss"] <= summary["throughput_loss"]


def test_ridge_forecaster_beats_persistence_on_a_daily_pattern():
    rng = np.random.default_rng(0)
    hours = np.arange(24 * 40)
    ci = 250 + 100 * np.sin(2 * np.pi * hours / 24) + rng.normal(0, 8, len(hours))
    forecast = rolling_forecast(ci, 0, HourlyForecaster())
    error = evaluate(ci, forecast)
    assert error.mae < 0.8 * error.persistence_mae and error.improvement > 0.2
    # too little history: persistence
    assert HourlyForecaster().predict(ci[:10], 10) == ci[9]
