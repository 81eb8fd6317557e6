"""Grid signals (carbon intensity, power caps) from wherever an operator has them, never fatal.

A ``SignalSource`` answers one question, "what is the value now?", as a ``Reading`` (value and
the time it describes), or raises ``SignalError`` with one line naming the problem. Sources:

- ``TraceSource``: a CSV trace (``load_trace`` finds the timestamp and value columns, including
  the shared traces' ``avg_CI`` and ElectricityMaps exports' carbon-intensity columns);
- ``HttpSource``: a JSON endpoint shaped like ElectricityMaps' ``carbon-intensity/latest`` or
  WattTime's ``data`` lists, fetched with httpx (the optional ``carbon`` extra);
- ``FileSource`` / ``SocketSource``: a number an operator writes to a file, or serves on a Unix
  socket (power caps, demand response);
- ``CallableSource``: any Python callable, and ``ZeusSource``: any object with Zeus's
  ``CarbonIntensityProvider`` method ``get_current_carbon_intensity()`` (duck typed).

``GuardedSignal`` wraps a source with a timeout and a staleness limit. Its ``poll`` never raises:
it answers the fresh value, else the last good value while that is not stale, else ``None`` (the
caller's safe default: the no-slowdown point for carbon), with the error as one line. So a
source that stops answering never stops training.
"""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from perseus.errors import PerseusError


class SignalError(PerseusError):
    """A grid signal could not be read (timeout, stale, unparsable, missing column)."""


@dataclass(frozen=True)
class Reading:
    """A signal's value and the Unix time it describes."""

    value: float
    at: float


@runtime_checkable
class SignalSource(Protocol):
    """Where a signal comes from: ``read`` answers the value at ``now`` or raises ``SignalError``."""

    name: str

    def read(self, now: float) -> Reading: ...


def _finite(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SignalError(f"{what}: {str(value)[:40]!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise SignalError(f"{what}: {number} is not a finite non-negative number")
    return number


def parse_time(text: str | float | int, what: str = "timestamp") -> float:
    """Unix seconds of an ISO 8601 time (naive means UTC) or of a number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SignalError(f"{what}: {text[:40]!r} is not an ISO 8601 time or Unix seconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


# ---------------------------------------------------------------- CSV traces

TIME_COLUMNS = ("timestamp", "datetime (utc)", "datetime", "time", "date", "point_time", "period", "utc")
VALUE_COLUMNS = ("avg_ci", "carbon_intensity", "carbonintensity", "carbon intensity", "ci", "moer", "value",
                 "power_cap_w", "cap_w")


def _pick(header: Sequence[str], wanted: Sequence[str], prefix: str | None) -> str | None:
    lowered = {name.strip().lower(): name for name in header}
    for name in wanted:
        if name in lowered:
            return lowered[name]
    if prefix is not None:
        # ElectricityMaps exports: "Carbon Intensity gCO₂eq/kWh (LCA)" / "(direct)", "Carbon intensity
        # gCO₂eq/kWh (Life cycle)": life cycle first, as ElectricityMaps' own default signal.
        matches = [name for name in header if name.strip().lower().startswith(prefix)]
        matches.sort(key=lambda n: 0 if ("lca" in n.lower() or "life" in n.lower()) else 1)
        if matches:
            return matches[0]
    return None


def _column(path: Path, header: Sequence[str], col: str | None, label: str, option: str) -> str:
    """The column named ``col``, or one line naming the option that chooses it."""
    if col is None or col not in header:
        raise SignalError(f"carbon trace {path}: no {label} column among {', '.join(header)[:120]}; "
                          f"name it with {option}")
    return col


@dataclass(frozen=True)
class Trace:
    """A signal over time: increasing Unix times and their values (missing rows dropped)."""

    times: np.ndarray
    values: np.ndarray
    name: str
    column: str
    missing: int = 0  # rows with an empty value, dropped

    def value_at(self, t: float) -> tuple[float, float]:
        """(value, its time) of the last row at or before ``t``; raises before the first row."""
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        if i < 0:
            raise SignalError(f"{self.name}: no value before {datetime.fromtimestamp(t, timezone.utc):%Y-%m-%d %H:%M} UTC "
                              "(the trace starts later)")
        return float(self.values[i]), float(self.times[i])

    def hourly(self) -> np.ndarray:
        """One value per hour from the first row to the last, a gap filled with the value before it."""
        start = self.times[0]
        hours = int((self.times[-1] - start) // 3600) + 1
        grid = start + 3600.0 * np.arange(hours)
        idx = np.searchsorted(self.times, grid + 1e-6, side="right") - 1
        return self.values[idx].astype(float)


def load_trace(path: str | os.PathLike[str], value_column: str | None = None,
               time_column: str | None = None) -> Trace:
    """Read a CSV trace; columns found by name unless given. One-line ``SignalError`` on bad input."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except OSError as error:
        raise SignalError(f"carbon trace {path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise SignalError(f"carbon trace {path}: not a text CSV file") from None
    if not rows or not any(rows[0]):
        raise SignalError(f"carbon trace {path}: empty file; expected a header row and one row per time")
    header = rows[0]
    tcol = _column(path, header, time_column or _pick(header, TIME_COLUMNS, None), "timestamp", "time_column")
    vcol = _column(path, header, value_column or _pick(header, VALUE_COLUMNS, "carbon intensity"), "value",
                   "value_column")
    ti, vi = header.index(tcol), header.index(vcol)
    times, values, missing = [], [], 0
    for line, row in enumerate(rows[1:], start=2):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(ti, vi):
            raise SignalError(f"carbon trace {path}, line {line}: {len(row)} fields, the header has {len(header)}")
        if not row[vi].strip():
            missing += 1
            continue
        times.append(parse_time(row[ti], f"carbon trace {path}, line {line}"))
        values.append(_finite(row[vi], f"carbon trace {path}, line {line}, {vcol}"))
    if not times:
        raise SignalError(f"carbon trace {path}: no row has a value in column {vcol!r}")
    t = np.asarray(times)
    if np.any(np.diff(t) <= 0):
        raise SignalError(f"carbon trace {path}: timestamps must increase row by row")
    return Trace(t, np.asarray(values, dtype=float), str(path), vcol, missing)


class TraceSource:
    """A recorded trace read at the current time (the demo and the emulator replay its clock)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.name = f"trace {trace.name}"

    def read(self, now: float) -> Reading:
        value, at = self.trace.value_at(now)
        return Reading(value, at)


# ---------------------------------------------------------------- JSON endpoints

LBS_PER_MWH_TO_G_PER_KWH = 0.45359237  # WattTime's lbs CO2 / MWh in gCO2 / kWh


def parse_json_reading(payload: Any, what: str = "response") -> Reading:
    """A reading from an ElectricityMaps- (``carbonIntensity``, ``datetime``) or WattTime-shaped
    (``data: [{point_time, value}]``, ``meta.units``) JSON document."""
    if not isinstance(payload, dict):
        raise SignalError(f"{what}: expected a JSON object, got {type(payload).__name__}")
    if "carbonIntensity" in payload:
        value = _finite(payload["carbonIntensity"], f"{what}: carbonIntensity")
        stamp = payload.get("datetime") or payload.get("updatedAt")
        if stamp is None:
            raise SignalError(f"{what}: carbonIntensity without a datetime")
        return Reading(value, parse_time(stamp, f"{what}: datetime"))
    data = payload.get("data")
    if isinstance(data, list) and data:
        rows = [row for row in data if isinstance(row, dict) and "value" in row and "point_time" in row]
        if not rows:
            raise SignalError(f"{what}: data has no point_time and value")
        # WattTime lists may be a forecast (first row: now) or history (last row: newest)
        newest = max(rows, key=lambda r: parse_time(r["point_time"], f"{what}: point_time"))
        units = str((payload.get("meta") or {}).get("units", "")).lower()
        value = _finite(newest["value"], f"{what}: value")
        if "lbs" in units:
            value *= LBS_PER_MWH_TO_G_PER_KWH
        return Reading(value, parse_time(newest["point_time"], f"{what}: point_time"))
    for key in ("value", "power_cap_w", "cap_w"):
        if key in payload:
            stamp = payload.get("at", payload.get("timestamp"))
            return Reading(_finite(payload[key], f"{what}: {key}"), time.time() if stamp is None else parse_time(stamp))
    raise SignalError(f"{what}: no carbonIntensity (ElectricityMaps), data[].value (WattTime) or value field")


class HttpSource:
    """A JSON endpoint polled with httpx (ElectricityMaps, WattTime, or a plain ``{"value": ...}``)."""

    def __init__(self, url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> None:
        try:
            import httpx
        except ImportError:
            raise SignalError("an HTTP carbon source needs httpx: pip install 'perseus-energy[carbon]'") from None
        self._httpx = httpx
        self.url = url
        self.name = f"http {url}"
        self._client = httpx.Client(headers=headers or {}, timeout=timeout_s, follow_redirects=True)

    def read(self, now: float) -> Reading:
        httpx = self._httpx
        try:
            response = self._client.get(self.url)
        except httpx.TimeoutException:
            raise SignalError(f"{self.name}: no answer within {self._client.timeout.read} s") from None
        except httpx.HTTPError as error:
            raise SignalError(f"{self.name}: {type(error).__name__}: {error}"[:200]) from None
        if response.status_code != 200:
            raise SignalError(f"{self.name}: HTTP {response.status_code} {response.reason_phrase}")
        try:
            payload = response.json()
        except ValueError:
            raise SignalError(f"{self.name}: the answer is not JSON ({response.text[:40]!r})") from None
        return parse_json_reading(payload, self.name)

    def close(self) -> None:
        self._client.close()


# ---------------------------------------------------------------- operator file and socket


def _parse_text(text: str, what: str, fallback_at: float) -> Reading:
    text = text.strip()
    if not text:
        raise SignalError(f"{what}: empty; write a number (watts or gCO2/kWh) or a JSON object")
    if text.startswith("{"):
        try:
            payload = json.loads(text)
        except ValueError:
            raise SignalError(f"{what}: not valid JSON ({text[:40]!r})") from None
        return parse_json_reading(payload, what)
    return Reading(_finite(text.split()[0], what), fallback_at)


class FileSource:
    """A number (or JSON object) an operator writes to a file; its time is the file's mtime."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = f"file {self.path}"

    def read(self, now: float) -> Reading:
        try:
            stat = self.path.stat()
            text = self.path.read_text(encoding="utf-8")
        except OSError as error:
            raise SignalError(f"{self.name}: cannot read it ({error.strerror or error})") from None
        except UnicodeDecodeError:
            raise SignalError(f"{self.name}: not a text file") from None
        return _parse_text(text, self.name, stat.st_mtime)


class SocketSource:
    """A Unix socket whose server writes the current value (a number or JSON) and closes."""

    def __init__(self, path: str | os.PathLike[str], timeout_s: float = 2.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self.name = f"socket {self.path}"

    def read(self, now: float) -> Reading:
        chunks: list[bytes] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(self.path)
                while sum(map(len, chunks)) < 4096:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    if b"\n" in chunk:
                        break
        except socket.timeout:
            raise SignalError(f"{self.name}: no answer within {self.timeout_s} s") from None
        except OSError as error:
            raise SignalError(f"{self.name}: {error.strerror or error}") from None
        try:
            text = b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError:
            raise SignalError(f"{self.name}: the answer is not text") from None
        return _parse_text(text.splitlines()[0] if text else "", self.name, now)


# ---------------------------------------------------------------- Python objects


class CallableSource:
    """A Python callable returning a number (read now), a ``(value, unix_time)`` pair or a ``Reading``."""

    def __init__(self, fn: Callable[[], Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or f"callable {getattr(fn, '__qualname__', type(fn).__name__)}"

    def read(self, now: float) -> Reading:
        try:
            result = self.fn()
        except SignalError:
            raise
        except Exception as error:  # noqa: BLE001 - a user's callable: any failure is a signal failure, never fatal
            raise SignalError(f"{self.name}: raised {type(error).__name__}: {error}"[:200]) from None
        if isinstance(result, Reading):
            return Reading(_finite(result.value, self.name), result.at)
        if isinstance(result, tuple) and len(result) == 2:
            return Reading(_finite(result[0], self.name), parse_time(result[1], self.name))
        return Reading(_finite(result, self.name), now)


class ZeusSource(CallableSource):
    """Zeus's ``CarbonIntensityProvider`` (``zeus.monitor.carbon``), by its one method."""

    def __init__(self, provider: Any) -> None:
        method = getattr(provider, "get_current_carbon_intensity", None)
        if not callable(method):
            raise SignalError(f"{type(provider).__name__} has no get_current_carbon_intensity(); "
                              "pass a Zeus CarbonIntensityProvider")
        super().__init__(method, f"zeus {type(provider).__name__}")


def as_source(obj: Any) -> SignalSource:
    """A source from what a user passes: a source, a Zeus provider, a callable, a number."""
    if isinstance(obj, SignalSource):
        return obj
    if callable(getattr(obj, "get_current_carbon_intensity", None)):
        return ZeusSource(obj)
    if callable(obj):
        return CallableSource(obj)
    if isinstance(obj, (int, float)):
        value = _finite(obj, "constant signal")
        return CallableSource(lambda: value, f"constant {value}")
    raise SignalError(f"{type(obj).__name__} is not a signal source; pass a source, a Zeus provider or a callable")


def source_from_spec(spec: str, *, value_column: str | None = None, timeout_s: float = 5.0) -> SignalSource:
    """A source from a config string: ``http(s)://...``, ``unix:PATH``, ``file:PATH``, a ``.csv``
    trace, or a path to an operator file."""
    if spec.startswith(("http://", "https://")):
        return HttpSource(spec, timeout_s=timeout_s)
    if spec.startswith("unix:"):
        return SocketSource(spec[5:], timeout_s=timeout_s)
    if spec.startswith("file:"):
        return FileSource(spec[5:])
    if spec.lower().endswith(".csv"):
        return TraceSource(load_trace(spec, value_column))
    return FileSource(spec)


# ---------------------------------------------------------------- the guard around a source


@dataclass(frozen=True)
class Polled:
    """What ``GuardedSignal.poll`` answers: the value to use (None: use the safe default), whether
    it is this poll's fresh value, its age, and the one-line error when the source failed."""

    value: float | None
    fresh: bool
    age_s: float | None
    error: str | None = None


class GuardedSignal:
    """A source with a timeout and a staleness limit; ``poll`` never raises (module docstring).

    ``stale_after_s`` None: a value never goes stale (a power cap stays in force until replaced).
    Sources are read in one worker thread so a hung callable or socket costs the caller at most
    ``timeout_s``; while the hung read is still running, polls answer from the last good value.
    """

    def __init__(self, source: SignalSource, *, timeout_s: float = 5.0, stale_after_s: float | None = 7200.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not timeout_s > 0:
            raise SignalError(f"signal timeout must be positive seconds, got {timeout_s!r}")
        if stale_after_s is not None and not stale_after_s > 0:
            raise SignalError(f"signal staleness limit must be positive seconds, got {stale_after_s!r}")
        self.source = source
        self.timeout_s = float(timeout_s)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.last_good: Reading | None = None
        self.last_error: str | None = None
        self.failures = 0
        self._pending: Future[Reading] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _read(self, now: float) -> Reading:
        if self._pending is not None and not self._pending.done():
            raise SignalError(f"{self.source.name}: the previous read is still running (over {self.timeout_s} s)")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perseus-signal")
        self._pending = self._pool.submit(self.source.read, now)
        try:
            return self._pending.result(timeout=self.timeout_s)
        except TimeoutError:
            raise SignalError(f"{self.source.name}: no answer within {self.timeout_s:g} s") from None

    def _stale(self, reading: Reading, now: float) -> bool:
        return self.stale_after_s is not None and now - reading.at > self.stale_after_s

    def poll(self, now: float | None = None) -> Polled:
        """The value to use now (module docstring); never raises."""
        now = self.clock() if now is None else now
        with self._lock:
            try:
                reading = self._read(now)
                if self.stale_after_s is not None and self._stale(reading, now):
                    raise SignalError(f"{self.source.name}: newest value is {(now - reading.at) / 60:.0f} min old, "
                                      f"over the {self.stale_after_s / 60:.0f} min staleness limit")
            except SignalError as error:
                self.failures += 1
                self.last_error = str(error)
            except Exception as error:  # noqa: BLE001 - a source's own bug must not stop training either
                self.failures += 1
                self.last_error = f"{self.source.name}: {type(error).__name__}: {error}"[:200]
            else:
                self.last_good = reading
                self.last_error = None
                return Polled(reading.value, True, now - reading.at)
            good = self.last_good
            if good is not None and not self._stale(good, now):
                return Polled(good.value, False, now - good.at, self.last_error)
            return Polled(None, False, None if good is None else now - good.at, self.last_error)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        close = getattr(self.source, "close", None)
        if callable(close):
            close()
