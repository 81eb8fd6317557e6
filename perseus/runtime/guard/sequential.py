"""The guard's tests: a one-sided CUSUM on each window's rank score of plan steps against its
probe (time, per rank), and one on the job's energy ratio of plan steps to probes (``EnergyTest``).

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

The energy test (``EnergyTest``): the plan is kept only while the job measurably saves energy
against the same run's default-clock probes. Why: a plan is deployed to save energy. A profile can promise a saving the clocks do not give (a
flat or wrong energy curve, a plan at default clocks labelled as saving); such a plan runs no
slower, so the time test keeps it, and it still costs its probes and its risk.

Whose energy: the job's. Each rank's energy is its own GPU's, and a stage slowed within its slack
saves energy while another stage waiting longer may spend a little more; only the sum over the
stages says what the plan saves. At each window's end every rank sends the medians of its counted
plan and probe steps' energies (``RankEnergy.row``, beside the time verdict in the all-gather);
every rank sums them alike (``job_window``) and runs the same ``EnergyTest`` on the job's window
ratio, so the verdict is the same on every rank without another message.

The test: per window the log ratio ``x = log(Σ plan medians / Σ probe medians)`` against the
boundary ``log(1 − margin)``, in standard errors of a window (a step's relative noise, ``noise``:
the ranks' robust relative spread of a step's energy, ``ab.relative_spread``, the largest among them
since the relative spread of a sum is at most that, or the scatter of the windows' own ratios where
larger; at least ``floor``), bounded to ``± clip`` so one outlier window moves the statistic by a
bounded amount, as the time test's rank score is. The same one-sided CUSUM as the time test
(``S ← max(0, S + z − reference)``, alarm at ``S ≥ threshold``: about 142 windows to a false alarm
for a plan exactly at the boundary, normal theory). Why a margin of 3 %: the CUSUM needs room
between "saves nothing" and what it keeps; with it a plan that spends 2 % more than default clocks
drifts up by about one standard error per window at a few % step noise and is dropped within 100
steps, while a plan saving 10 % or more drifts down by two or more and is not dropped
(``benchmarks/bench_guard.py``).

Unmeasured steps (energy None: the counter's reads failed) are left out, never counted as 0 J. A
rank's window with a step that read 0 J (shorter than the counter's update period: its readings are
whole counter updates, and their medians say nothing finer) gives no energy evidence either.

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
from perseus.output.wording import Z95, saving_phrase
from perseus.runtime.guard.ab import relative_spread
from perseus.runtime.guard.placement import Backoff

MAD_TO_SD = 1.4826  # MAD × this = standard deviation, for normal noise
MEDIAN_SE = 1.2533  # a median's standard error over a mean's, for normal noise
RECENT = 64  # windows the confidence bound and the energy noise look back over (follows a slow drift)


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


# ---------------------------------------------------------------- the energy test (module docstring)

ENERGY_COLUMNS = 5  # the row's floats: plan J, probe J, plan steps, probe steps, relative spread


@dataclass(frozen=True)
class EnergySettings:
    """The energy test's constants."""

    margin: float = 0.03  # a plan must save more than this share of the probes' energy per step
    reference: float = 0.25  # CUSUM drift allowance per window, in standard errors (the time test's)
    threshold: float = 5.0  # CUSUM alarm level (the config's ``guard_threshold``)
    clip: float = 2.0  # a window's score is within ± this
    floor: float = 0.005  # the least relative noise of a step's energy assumed
    confident_after: int = 4  # windows before the saving's interval may let the windows grow

    def __post_init__(self) -> None:
        if not 0 <= self.margin < 0.5:
            raise ValueError(f"energy margin must be in [0, 0.5), got {self.margin}")
        if self.reference <= 0 or self.threshold <= 0 or self.clip <= 0 or self.floor <= 0:
            raise ValueError("energy reference, threshold, clip and floor must be > 0")


@dataclass(frozen=True)
class RankEnergy:
    """One rank's window: medians of its counted, measured plan and probe steps' energy."""

    plan_j: float
    probe_j: float
    n_plan: int
    n_probe: int
    spread: float | None  # robust relative standard deviation of a step's energy (None: unknown)

    def row(self) -> list[float]:
        return [self.plan_j, self.probe_j, float(self.n_plan), float(self.n_probe),
                math.nan if self.spread is None else self.spread]

    @staticmethod
    def from_row(row: Sequence[float]) -> RankEnergy | None:
        """A rank's columns as gathered (None: that rank had no energy evidence, or sent none)."""
        if len(row) < ENERGY_COLUMNS or math.isnan(row[0]) or math.isnan(row[1]):
            return None
        return RankEnergy(row[0], row[1], int(row[2]), int(row[3]), None if math.isnan(row[4]) else row[4])


def no_energy_row() -> list[float]:
    return [math.nan] * ENERGY_COLUMNS


def rank_energy(plan_j: Sequence[float | None], probe_j: Sequence[float | None]) -> RankEnergy | None:
    """A rank's window from its counted steps' energies (module docstring: None and 0 J)."""
    plan = [e for e in plan_j if e is not None]
    probe = [e for e in probe_j if e is not None]
    if not plan or not probe or min(plan + probe) <= 0:
        return None
    return RankEnergy(median(plan), median(probe), len(plan), len(probe), relative_spread(plan, probe))


@dataclass(frozen=True)
class JobWindow:
    """The job's energy in one window: log(plan / probe) of the summed medians."""

    log_ratio: float
    n_plan: int  # the fewest counted plan steps among the ranks summed
    n_probe: int
    spread: float | None  # the largest rank spread
    ranks: int  # ranks with energy evidence


def job_window(ranks: Sequence[RankEnergy]) -> JobWindow | None:
    """The window's job ratio over the ranks that measured it (None: none did)."""
    if not ranks:
        return None
    spreads = [r.spread for r in ranks if r.spread is not None]
    return JobWindow(math.log(sum(r.plan_j for r in ranks) / sum(r.probe_j for r in ranks)),
                     min(r.n_plan for r in ranks), min(r.n_probe for r in ranks),
                     max(spreads) if spreads else None, len(ranks))


@dataclass(frozen=True)
class EnergyVerdict:
    """Where the energy test stands after a window (the same on every rank)."""

    statistic: float
    threshold: float
    confidence: Confidence  # ALARM: drop; SUSPECT: shortest windows; CONFIDENT: saves more than the margin
    windows: int  # windows with evidence since the last restart
    ratio: float | None  # this window's job energy ratio plan / probe (None: no evidence)
    saving: float  # 1 − plan / probe energy over the windows since the last restart
    saving_low: float  # its 95 % interval
    saving_high: float

    @property
    def alarm(self) -> bool:
        return self.confidence is Confidence.ALARM

    def as_dict(self) -> dict[str, object]:
        return {"statistic": self.statistic, "threshold": self.threshold, "confidence": self.confidence.value,
                "windows": self.windows, "ratio": self.ratio, "saving": self.saving,
                "saving_low": self.saving_low, "saving_high": self.saving_high}

    def measured(self) -> str:
        """``"2.0% more energy (95 % interval -6.1..+2.0% saved, 7 windows)"``."""
        return (f"{saving_phrase(self.saving)} (95 % interval {100 * self.saving_low:+.1f}.."
                f"{100 * self.saving_high:+.1f}% saved, {self.windows} window{'s' if self.windows != 1 else ''})")

    def reason(self) -> str:
        return (f"the plan does not measurably save energy against default clocks: job {self.measured()}; "
                f"energy CUSUM {self.statistic:.2f} >= {self.threshold:g}: falling back to default clocks")


class EnergyTest:
    """The job's energy CUSUM (module docstring); every rank holds an identical one."""

    def __init__(self, settings: EnergySettings | None = None) -> None:
        self.settings = settings or EnergySettings()
        self.statistic = 0.0
        self.alarms = 0
        self._spreads: deque[float] = deque(maxlen=RECENT)  # the windows' rank spreads
        self._logs: deque[tuple[float, float]] = deque(maxlen=RECENT)  # (x, sqrt(1/n + 1/k)) since restart
        self._last: EnergyVerdict | None = None

    def noise(self) -> float:
        """A step's relative energy noise: the larger of the recent windows' own spreads (their
        median) and, from ``confident_after`` windows on, the scatter of the windows' ratios since
        the last restart (what a window's steps cannot see: noise that drifts slower than a window,
        and a spread of three or four steps read low); at least ``floor``."""
        noise = max(self.settings.floor, median(self._spreads)) if self._spreads else self.settings.floor
        if len(self._logs) >= self.settings.confident_after:
            centre = median(x for x, _ in self._logs)
            noise = max(noise, MAD_TO_SD * median(abs(x - centre) / scale for x, scale in self._logs))
        return noise

    def observe(self, window: JobWindow | None) -> EnergyVerdict | None:
        """Add one window (None: no rank measured it: nothing learnt); the verdict so far (None
        before the first window with evidence)."""
        s = self.settings
        if window is None:
            return None if self._last is None else self._verdict(None)
        if window.spread is not None:
            self._spreads.append(window.spread)
        scale = math.sqrt(1 / window.n_plan + 1 / window.n_probe)
        self._logs.append((window.log_ratio, scale))
        z = (window.log_ratio - math.log(1 - s.margin)) / (self.noise() * scale)
        self.statistic = max(0.0, self.statistic + max(-s.clip, min(s.clip, z)) - s.reference)
        if self.statistic >= s.threshold:
            self.alarms += 1
        return self._verdict(math.exp(window.log_ratio))

    def _verdict(self, ratio: float | None) -> EnergyVerdict:
        s = self.settings
        saving, low, high = self.estimate()
        if self.statistic >= s.threshold:
            confidence = Confidence.ALARM
        elif self.statistic >= s.threshold / 2:
            confidence = Confidence.SUSPECT
        elif len(self._logs) >= s.confident_after and low > s.margin:
            confidence = Confidence.CONFIDENT
        else:
            confidence = Confidence.UNSURE
        self._last = EnergyVerdict(self.statistic, s.threshold, confidence, len(self._logs), ratio, saving, low, high)
        return self._last

    def estimate(self) -> tuple[float, float, float]:
        """The saving over the windows since the last restart, with its 95 % interval: the median
        window ratio, its standard error the larger of the windows' own scatter and their noise."""
        if not self._logs:
            return 0.0, -math.inf, math.inf
        xs = [x for x, _ in self._logs]
        m = len(xs)
        centre = median(xs)
        se = self.noise() * median(scale for _, scale in self._logs) / math.sqrt(m)
        if m >= 3:
            se = max(se, MEDIAN_SE * MAD_TO_SD * median(abs(x - centre) for x in xs) / math.sqrt(m))
        return 1 - math.exp(centre), 1 - math.exp(centre + Z95 * se), 1 - math.exp(centre - Z95 * se)

    def restart(self) -> None:
        """The deployed point changed: its energy is another's (the noise estimate is kept)."""
        self.statistic = 0.0
        self._logs.clear()
        self._last = None
