"""The guard's test: a one-sided CUSUM on each window's rank score of plan steps against its probe.

Why ranks: within one window the probe block sits at a uniformly random offset (``placement.py``),
so under an honest plan the counted probe steps and the counted plan steps of the window are
exchangeable, whatever the machine's noise and whatever periodic host work the loop does (a
data-loader epoch of 4 steps, a log every 10, a checkpoint every 100). The Mann-Whitney count
``U`` of (plan, probe) pairs in which the plan step is slower then has a known distribution, mean
``n·k/2`` and variance ``n·k·(n + k + 1)/12`` (``n`` plan, ``k`` probe steps), with no assumption
on the noise. Its standard score ``z`` has mean 0 and variance 1 (a little less with ties), is
bounded (about ±1.7 for one probe), so one outlier step can move it by one rank and no more.
Before ranking, the probes are scaled by the target (``target_ratio``: 1 for no slowdown, more for
a straggler or external target) and by ``1 + tolerance``: an honest plan then scores below 0 on
average, and a plan slower than its target by more than the tolerance scores above.

Why a CUSUM: ``S ← max(0, S + z − reference)``, alarm when ``S ≥ threshold``. It decides as soon
as the evidence allows (a badly slow plan crosses in a few windows), never stops watching (a plan
that turns slow later is caught too), and its false-alarm rate follows from ``z``'s null law alone:
for independent standard increments, the mean number of windows to a false alarm (Siegmund's
approximation, ``null_windows_to_alarm``) is 142 at the defaults (reference 0.25, threshold 5),
more under the tolerance's shift. ``benchmarks/bench_guard.py`` measures it per deployed step.

Confidence and probe cost: while ``S`` is 0 after a window the next window is ``Backoff.growth``
times longer (up to ``Backoff.longest``: 1 % of steps at default clocks); when ``S`` reaches half
the threshold the windows go back to the shortest, so a suspicion is settled quickly.

Pure: no clock, no I/O; the same windows give the same decisions.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from perseus.errors import ConfigError
from perseus.runtime.guard.placement import Backoff

MAD_TO_SD = 1.4826  # MAD × this = standard deviation, for normal noise
MEDIAN_SE = 1.2533  # a median's standard error over a mean's, for normal noise
RECENT = 64  # windows the confidence bound looks back over (follows a slow drift)


def rank_score(plan_s: Sequence[float], probe_s: Sequence[float], *, shift: float = 1.0) -> float:
    """Standardized Mann-Whitney score of plan steps against probe steps × ``shift``: > 0 when the
    plan steps are slower. Mean 0 and variance 1 when the two samples are exchangeable."""
    n, k = len(plan_s), len(probe_s)
    if n < 1 or k < 1:
        raise ValueError(f"a window score needs plan and probe steps, got {n} and {k}")
    if shift <= 0:
        raise ValueError(f"shift must be positive, got {shift}")
    u = 0.0
    for x in plan_s:
        for y in probe_s:
            y = y * shift
            u += 1.0 if x > y else 0.5 if x == y else 0.0
    return (u - n * k / 2) / math.sqrt(n * k * (n + k + 1) / 12)


def null_windows_to_alarm(reference: float, threshold: float) -> float:
    """Mean windows to a false alarm for standard normal increments (Siegmund's approximation)."""
    b = threshold + 1.166
    return (math.exp(2 * reference * b) - 2 * reference * b - 1) / (2 * reference ** 2)


@dataclass(frozen=True)
class SequentialSettings:
    """The test's constants (PerseusConfig's ``guard_*``)."""

    tolerance: float = 0.01  # a plan this much slower than its target is still within
    reference: float = 0.25  # CUSUM drift allowance per window, in standard scores
    threshold: float = 5.0  # CUSUM alarm level
    detectable: float = 0.03  # the slowdown the windows stay short enough to catch
    confident_after: int = 4  # windows before the estimate may be trusted
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 0.5:
            raise ConfigError(f"guard tolerance must be in [0, 0.5), got {self.tolerance}")
        if not self.tolerance < self.detectable < 1:
            raise ConfigError(f"guard detectable slowdown must be in (tolerance, 1), got {self.detectable}")
        if self.reference <= 0 or self.threshold <= 0:
            raise ConfigError(f"guard reference and threshold must be > 0, got {self.reference} and {self.threshold}")

    @property
    def null_windows(self) -> float:
        return null_windows_to_alarm(self.reference, self.threshold)


class Confidence(enum.Enum):
    """What the statistic says after a window, and so how long the next one is."""

    CONFIDENT = "confident"  # the plan is, with confidence, not ``detectable`` slower: the windows grow
    UNSURE = "unsure"  # same length
    SUSPECT = "suspect"  # S >= threshold / 2: back to the shortest
    ALARM = "alarm"  # S >= threshold: measurably slower


@dataclass(frozen=True)
class WindowVerdict:
    """One window's evidence and where it leaves the test (one pipeline's)."""

    score: float  # the window's rank score
    statistic: float  # S after it
    confidence: Confidence
    ratio: float  # median(plan) / median(probe): the window's time ratio, for the report
    excess: float | None  # at an alarm: the least slowdown over the target the alarm's windows support
    upper: float | None  # upper bound on the slowdown over the target from the windows since the last move

    def as_dict(self) -> dict[str, object]:
        return {"score": self.score, "statistic": self.statistic, "confidence": self.confidence.value,
                "ratio": self.ratio, "excess": self.excess, "upper": self.upper}


class SequentialTest:
    """The CUSUM of one pipeline's windows (module docstring)."""

    def __init__(self, settings: SequentialSettings | None = None) -> None:
        self.settings = settings or SequentialSettings()
        self.statistic = 0.0
        self.windows = 0
        self.alarms = 0
        self._run: list[float] = []  # log excess of the windows since S last was 0
        self._recent: deque[float] = deque(maxlen=RECENT)  # log excess of the windows since the last move

    def observe(self, plan_s: Sequence[float], probe_s: Sequence[float], target_ratio: float = 1.0) -> WindowVerdict:
        """Add one window: its counted plan steps and counted probe steps (same judged quantity)."""
        if target_ratio <= 0:
            raise ValueError(f"target_ratio must be positive, got {target_ratio}")
        s = self.settings
        score = rank_score(plan_s, probe_s, shift=target_ratio * (1.0 + s.tolerance))
        ratio = median(plan_s) / median(probe_s)
        self.windows += 1
        self.statistic = max(0.0, self.statistic + score - s.reference)
        excess_log = math.log(ratio / target_ratio)
        self._recent.append(excess_log)
        if self.statistic == 0.0:
            self._run = []
        else:
            self._run.append(excess_log)
        upper = self.upper_bound()
        if self.statistic >= s.threshold:
            self.alarms += 1
            excess = max(s.tolerance, math.exp(median(self._run)) - 1.0)
            return WindowVerdict(score, self.statistic, Confidence.ALARM, ratio, excess, upper)
        if self.statistic >= s.threshold / 2:
            confidence = Confidence.SUSPECT
        elif upper is not None and upper < s.detectable:
            confidence = Confidence.CONFIDENT
        else:
            confidence = Confidence.UNSURE
        return WindowVerdict(score, self.statistic, confidence, ratio, None, upper)

    def upper_bound(self) -> float | None:
        """Upper confidence bound on the slowdown over the target, from the windows since the last move:
        their median log ratio + 2 robust standard errors of a median (None before ``confident_after``)."""
        values = list(self._recent)
        if len(values) < self.settings.confident_after:
            return None
        centre = median(values)
        spread = MAD_TO_SD * median(abs(v - centre) for v in values)
        return math.exp(centre + 2.0 * MEDIAN_SE * spread / math.sqrt(len(values))) - 1.0

    def restart(self) -> None:
        """The deployed point changed: evidence about the old one says nothing about the new."""
        self.statistic = 0.0
        self._run = []
        self._recent.clear()


def next_length(length: int, verdicts: Sequence[WindowVerdict], backoff: Backoff) -> int:
    """The next window's length from every pipeline's verdict (the same on every rank): the least
    confident pipeline decides."""
    worst = {Confidence.CONFIDENT: 0, Confidence.UNSURE: 1, Confidence.SUSPECT: 2, Confidence.ALARM: 3}
    level = max((worst[v.confidence] for v in verdicts), default=1)
    if level == 0:
        return backoff.grow(length)
    if level == 1:
        return length
    return backoff.first
