"""How a saving and a time change are said in words: the sign is in the words, never a minus.

"−3.9 % less energy" reads as a saving to anyone skimming; it means 3.9 % *more* energy. Every
place that puts a saving into words (the report page and its figures, the runtime's per-step log
line through ``perseus.runtime.guard.ab``) uses these, so they cannot drift apart.
"""

from __future__ import annotations


def _pm(stderr: float | None) -> str:
    return f" ± {100 * stderr:.1f}%" if stderr is not None else ""


def energy_change(saving: float, stderr: float | None = None) -> str:
    """``"7.7% less energy"`` or ``"3.9% more energy"`` (``saving`` = 1 − energy / baseline)."""
    word = "less" if saving >= 0 else "more"
    return f"{100 * abs(saving):.1f}%{_pm(stderr)} {word} energy"


def saving_phrase(saving: float, stderr: float | None = None) -> str:
    """``"saves 7.7% energy"`` or ``"7.7% more energy"``: a verb phrase for a log line."""
    if saving >= 0:
        return f"saves {100 * saving:.1f}%{_pm(stderr)} energy"
    return f"{100 * -saving:.1f}%{_pm(stderr)} more energy"


def time_phrase(change: float, stderr: float | None = None) -> str:
    """``"1.2% slower"`` or ``"0.4% faster"`` (``change`` = time / baseline − 1)."""
    word = "slower" if change > 0 else "faster"
    return f"{100 * abs(change):.1f}%{_pm(stderr)} {word}"


Z95 = 1.96  # a normal 95 % interval: value ± this × standard error


def _interval(value: float, stderr: float) -> str:
    low, high = value - Z95 * stderr, value + Z95 * stderr
    return f"{100 * low:+.1f}..{100 * high:+.1f}%"


def measured_saving_phrase(saving: float, stderr: float | None) -> str:
    """The run's saving with its 95 % interval; ``"energy change not yet measurable"`` while the
    interval spans zero (or the spread is unknown): a saving read from noise is not a saving."""
    if stderr is None:
        return "energy change not yet measurable (spread unknown)"
    if abs(saving) <= Z95 * stderr:
        return f"energy change not yet measurable ({_interval(-saving, stderr)} energy, 95 % interval)"
    return f"{saving_phrase(saving, stderr)} (95 % interval {_interval(saving, stderr)} saved)"


def measured_time_phrase(change: float, stderr: float | None) -> str:
    """The run's time change with its 95 % interval; ``"time change not yet measurable"`` while it spans zero."""
    if stderr is None:
        return "time change not yet measurable (spread unknown)"
    if abs(change) <= Z95 * stderr:
        return f"time change not yet measurable ({_interval(change, stderr)} time, 95 % interval)"
    return f"{time_phrase(change, stderr)} (95 % interval {_interval(change, stderr)} time)"
