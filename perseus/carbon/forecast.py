"""Next-hour carbon intensity from recent history: Chase's lightweight forecaster.

Why a model at all: a window's frontier point is chosen before the window, so the policy needs
the coming hour's intensity, not the last one. Chase predicts it from the time of day and recent
values; so does ``HourlyForecaster``: a ridge regression (numpy least squares on a system with
the ridge rows appended) on

- the hour of day of the predicted hour (24 indicator columns, which also carry the intercept),
- the last value, the one before it, the value 24 h before the predicted hour (a day earlier),
  and the mean of the last 24 h,

fitted on the trailing ``train_days`` of history and refitted every ``refit_every`` hours. Below
``min_train_hours`` of history it predicts persistence (the last value). ``PersistenceForecaster``
is the reference every error is measured against (``evaluate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from perseus.errors import ConfigError

LAGS = 24  # hours of history a feature row reads
# hourly values, newest last: an array in the replay, the policy's list in the runtime
History = Sequence[float] | np.ndarray


def _features(history: np.ndarray, hours_of_day: np.ndarray) -> np.ndarray:
    """One row per prediction: history[i] holds the LAGS values before predicted hour i (oldest first)."""
    rows = history.shape[0]
    onehot = np.zeros((rows, 24))
    onehot[np.arange(rows), hours_of_day % 24] = 1.0
    last, before, day_ago = history[:, -1], history[:, -2], history[:, 0]
    mean = history.mean(axis=1)
    return np.column_stack([onehot, last, before, day_ago, mean])


@dataclass
class HourlyForecaster:
    """Ridge on hour-of-day and lags (module docstring); ``predict`` answers the next hour's value."""

    alpha: float = 0.01
    train_days: int = 28
    refit_every: int = 24
    min_train_hours: int = 72

    def __post_init__(self) -> None:
        if not self.alpha >= 0 or self.train_days < 1 or self.refit_every < 1:
            raise ConfigError("forecaster: alpha >= 0, train_days >= 1 and refit_every >= 1 are required")
        self._coef: np.ndarray | None = None
        self._fitted_at = -10**9
        self._scale = 1.0

    def fit(self, values: np.ndarray, first_hour_of_day: int) -> None:
        """Fit on an hourly series whose first value is at ``first_hour_of_day`` (UTC)."""
        n = len(values)
        targets = np.arange(LAGS, n)
        if len(targets) < 24:
            self._coef = None
            return
        windows = np.lib.stride_tricks.sliding_window_view(values[:-1], LAGS)[: len(targets)]
        x = _features(windows, (first_hour_of_day + targets) % 24)
        y = values[targets]
        self._scale = float(np.mean(np.abs(y))) or 1.0
        x = x.copy()
        x[:, 24:] /= self._scale  # lags on the scale of the indicators, so one alpha fits both
        ridge = np.sqrt(self.alpha) * np.eye(x.shape[1])
        ridge[:24, :24] *= 0.01  # the hour-of-day levels are barely shrunk: they are the intercept
        a = np.vstack([x, ridge])
        b = np.concatenate([y, np.zeros(x.shape[1])])
        self._coef = np.linalg.lstsq(a, b, rcond=None)[0]

    def predict(self, history: History, next_hour_of_day: int, index: int | None = None) -> float:
        """The value of the hour after ``history`` (hourly, newest last), the hour being
        ``next_hour_of_day`` UTC. ``index`` (hours since the series began) paces refits."""
        values = np.asarray(history, dtype=float)
        if len(values) == 0:
            raise ConfigError("forecaster: no history to predict from")
        at = len(values) if index is None else index
        if len(values) >= self.min_train_hours and at - self._fitted_at >= self.refit_every:
            window = values[-(self.train_days * 24 + LAGS):]
            self.fit(window, (next_hour_of_day - len(window)) % 24)
            self._fitted_at = at
        if self._coef is None or len(values) < LAGS:
            return float(values[-1])
        x = _features(values[None, -LAGS:], np.array([next_hour_of_day]))
        x[:, 24:] /= self._scale
        return float(max(x[0] @ self._coef, 0.0))


class PersistenceForecaster:
    """The next hour equals the last one: the reference a forecaster has to beat."""

    def predict(self, history: History, next_hour_of_day: int, index: int | None = None) -> float:
        return float(history[-1])


class Forecaster(Protocol):
    """What ``rolling_forecast`` asks of a forecaster: the next hour's value from the history so far."""

    def predict(self, history: History, next_hour_of_day: int, index: int | None = None) -> float: ...


def rolling_forecast(values: np.ndarray, first_hour_of_day: int, forecaster: Forecaster,
                     warmup: int = LAGS) -> np.ndarray:
    """Each hour's forecast made from the hours before it (the first ``warmup`` hours: persistence
    of the first value, as a job that has just started has nothing better)."""
    out = np.empty(len(values))
    out[: max(warmup, 1)] = values[0]
    for i in range(max(warmup, 1), len(values)):
        out[i] = forecaster.predict(values[:i], (first_hour_of_day + i) % 24, i)
    return out


@dataclass(frozen=True)
class ForecastError:
    """Mean absolute error of a forecaster and of persistence on the same hours."""

    mae: float
    persistence_mae: float
    hours: int

    @property
    def improvement(self) -> float:
        """Fraction of persistence's error the forecaster removes."""
        return 1.0 - self.mae / self.persistence_mae if self.persistence_mae > 0 else 0.0


def evaluate(values: np.ndarray, forecasts: np.ndarray, skip: int = LAGS) -> ForecastError:
    """MAE of ``forecasts`` against persistence, on hours ``skip`` onward."""
    actual = values[skip:]
    persistence = values[skip - 1 : -1]
    return ForecastError(float(np.mean(np.abs(forecasts[skip:] - actual))),
                         float(np.mean(np.abs(persistence - actual))), len(actual))
