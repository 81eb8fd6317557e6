"""Grid signal sources: each one's failure modes give one clear line, and the guard keeps going
(last good value while fresh, else None: the caller's safe default)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from perseus.carbon.signals import (CallableSource, FileSource, GuardedSignal, HttpSource, Reading, SignalError,
                                    SocketSource, Trace, TraceSource, ZeusSource, as_source, load_trace, parse_json_reading,
                                    parse_time, source_from_spec)

T0 = parse_time("2022-01-01T00:00:00Z")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- CSV traces


def test_shared_trace_columns_are_found_and_empty_hours_dropped(tmp_path):
    path = write(tmp_path / "ciso.csv", "timestamp,WND,SUN,avg_CI\n"
                 "2022-01-01 00:00:00+00:00,1,2,222.5\n2022-01-01 01:00:00+00:00,1,2,\n"
                 "2022-01-01 02:00:00+00:00,1,2,271.0\n")
    trace = load_trace(path)
    assert trace.column == "avg_CI" and trace.missing == 1
    assert trace.values.tolist() == [222.5, 271.0]
    # the empty hour reads as the hour before it; hourly() fills it the same way
    assert trace.value_at(T0 + 3600 + 5) == (222.5, T0)
    assert trace.hourly().tolist() == [222.5, 222.5, 271.0]


def test_electricitymaps_export_prefers_the_life_cycle_column(tmp_path):
    path = write(tmp_path / "em.csv",
                 "Datetime (UTC),Country,Zone Name,Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)\n"
                 "2022-01-01 00:00:00,US,CAISO,200.0,250.0\n2022-01-01 01:00:00,US,CAISO,210.0,260.0\n")
    trace = load_trace(path)
    assert "LCA" in trace.column and trace.values.tolist() == [250.0, 260.0]
    assert trace.times[0] == T0  # naive times are UTC
    assert load_trace(path, value_column="Carbon Intensity gCO₂eq/kWh (direct)").values[0] == 200.0


@pytest.mark.parametrize("text, message", [
    ("timestamp,solar\n2022-01-01T00:00Z,3\n", "no value column"),
    ("when,avg_CI\n2022-01-01T00:00Z,3\n", "no timestamp column"),
    ("timestamp,avg_CI\n2022-01-01T00:00Z,lots\n", "line 2, avg_CI: 'lots' is not a number"),
    ("timestamp,avg_CI\nyesterday,3\n", "line 2: 'yesterday' is not an ISO 8601 time"),
    ("timestamp,avg_CI\n2022-01-01T01:00Z,3\n2022-01-01T00:00Z,4\n", "timestamps must increase"),
    ("timestamp,avg_CI\n2022-01-01T00:00Z,-5\n", "not a finite non-negative number"),
    ("", "empty file"),
])
def test_bad_traces_give_one_line_naming_the_problem(tmp_path, text, message):
    with pytest.raises(SignalError, match=message) as info:
        load_trace(write(tmp_path / "bad.csv", text))
    assert "\n" not in str(info.value) and "bad.csv" in str(info.value)


def test_missing_trace_file(tmp_path):
    with pytest.raises(SignalError, match="cannot read it"):
        load_trace(tmp_path / "nope.csv")


def test_trace_source_before_its_start_fails_then_guard_answers_none():
    trace = Trace(np.array([T0, T0 + 3600]), np.array([100.0, 300.0]), "mem", "avg_CI")
    guard = GuardedSignal(TraceSource(trace), stale_after_s=5400)
    early = guard.poll(T0 - 10)
    assert early.value is None and "no value before" in early.error
    assert guard.poll(T0 + 3700) == guard.poll(T0 + 3700)  # deterministic
    assert guard.poll(T0 + 3700).value == 300.0
    # past the end of the trace the newest row goes stale: no value, a clear line
    stale = guard.poll(T0 + 3600 + 6000)
    assert stale.value is None and "staleness limit" in stale.error


# ---------------------------------------------------------------- the guard


def test_timeout_keeps_the_last_good_value_and_says_why():
    slow = threading.Event()
    calls = []

    def source() -> float:
        calls.append(1)
        if slow.is_set():
            time.sleep(1.0)
        return 250.0

    clock = [1000.0]
    guard = GuardedSignal(CallableSource(source, "grid"), timeout_s=0.1, stale_after_s=3600, clock=lambda: clock[0])
    assert guard.poll().value == 250.0 and guard.poll().fresh
    slow.set()
    clock[0] += 60
    polled = guard.poll()
    assert polled.value == 250.0 and not polled.fresh and polled.age_s == 60
    assert polled.error == "grid: no answer within 0.1 s"
    # the hung read is still running: no second thread piles up, the answer stays the last good one
    again = guard.poll()
    assert again.value == 250.0 and "still running" in again.error
    # once the last good value is older than the staleness limit: None (the safe default)
    clock[0] += 3600
    assert guard.poll().value is None
    guard.close()


@pytest.mark.parametrize("result, message", [
    ("abc", "'abc' is not a number"),
    (float("nan"), "not a finite non-negative"),
    (None, "is not a number"),
])
def test_garbage_from_a_callable(result, message):
    guard = GuardedSignal(CallableSource(lambda: result, "fn"))
    polled = guard.poll(0.0)
    assert polled.value is None and message in polled.error and guard.failures == 1


def test_a_raising_callable_and_a_buggy_source_do_not_escape():
    def boom() -> float:
        raise RuntimeError("grid API down")

    assert "raised RuntimeError: grid API down" in GuardedSignal(CallableSource(boom, "fn")).poll(0.0).error

    class Buggy:
        name = "buggy"

        def read(self, now):
            return 1 / 0

    assert "ZeroDivisionError" in GuardedSignal(Buggy()).poll(0.0).error


def test_callable_readings_carry_their_own_time():
    guard = GuardedSignal(CallableSource(lambda: (300.0, "2022-01-01T00:00:00Z")), stale_after_s=600)
    polled = guard.poll(T0 + 900)
    assert polled.value is None and "15 min old" in polled.error


def test_zeus_providers_are_accepted_by_their_method():
    class ElectricityMapsClient:  # the shape of zeus.monitor.carbon's provider
        def get_current_carbon_intensity(self) -> float:
            return 321.0

    source = as_source(ElectricityMapsClient())
    assert isinstance(source, ZeusSource) and source.read(0.0).value == 321.0
    with pytest.raises(SignalError, match="pass a Zeus CarbonIntensityProvider"):
        ZeusSource(object())
    with pytest.raises(SignalError, match="not a signal source"):
        as_source("CISO")


# ---------------------------------------------------------------- operator file and socket


def test_operator_file(tmp_path):
    path = write(tmp_path / "cap", "250000\n")
    reading = FileSource(path).read(0.0)
    assert reading.value == 250000.0 and reading.at == pytest.approx(path.stat().st_mtime)
    write(path, '{"power_cap_w": 200000, "at": "2022-01-01T00:00:00Z"}')
    assert FileSource(path).read(0.0) == Reading(200000.0, T0)
    for text, message in (("", "empty"), ("{nope", "not valid JSON"), ("many watts", "is not a number")):
        write(path, text)
        with pytest.raises(SignalError, match=message):
            FileSource(path).read(0.0)
    with pytest.raises(SignalError, match="cannot read it"):
        FileSource(tmp_path / "absent").read(0.0)
    assert isinstance(source_from_spec(f"file:{path}"), FileSource)


def _serve_once(path: str, answer: bytes | None, ready: threading.Event) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        ready.set()
        conn, _ = server.accept()
        with conn:
            if answer is None:
                time.sleep(1.0)  # a hung operator daemon
            else:
                conn.sendall(answer)


@pytest.mark.parametrize("answer, value, message", [
    (b"180000\n", 180000.0, None),
    (b'{"value": 150000}\n', 150000.0, None),
    (b"\xff\xfe", None, "not text"),
    (None, None, "no answer within 0.2 s"),
])
def test_unix_socket(tmp_path, answer, value, message):
    path = str(tmp_path / "cap.sock")
    ready = threading.Event()
    thread = threading.Thread(target=_serve_once, args=(path, answer, ready), daemon=True)
    thread.start()
    ready.wait(5)
    source = source_from_spec(f"unix:{path}", timeout_s=0.2)
    if message is None:
        assert source.read(5.0).value == value
    else:
        with pytest.raises(SignalError, match=message):
            source.read(5.0)
    thread.join(5)
    with pytest.raises(SignalError, match="socket"):
        SocketSource(str(tmp_path / "gone.sock")).read(0.0)


# ---------------------------------------------------------------- HTTP JSON


def test_json_shapes():
    em = {"zone": "US-CAL-CISO", "carbonIntensity": 302, "datetime": "2022-01-01T00:00:00.000Z",
          "updatedAt": "2022-01-01T00:05:00.000Z"}
    assert parse_json_reading(em) == Reading(302.0, T0)
    wt = {"data": [{"point_time": "2022-01-01T00:00:00+00:00", "value": 1000.0},
                   {"point_time": "2021-12-31T23:55:00+00:00", "value": 900.0}],
          "meta": {"signal_type": "co2_moer", "units": "lbs_co2_per_mwh"}}
    reading = parse_json_reading(wt)
    assert reading.at == T0 and reading.value == pytest.approx(453.59237)
    for bad, message in (([1, 2], "expected a JSON object"), ({"carbonIntensity": 3}, "without a datetime"),
                         ({"data": [{"x": 1}]}, "no point_time and value"), ({"zone": "x"}, "no carbonIntensity")):
        with pytest.raises(SignalError, match=message):
            parse_json_reading(bad)


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"

    def do_GET(self):  # http.server's name
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/error":
            self.send_response(503)
            self.end_headers()
            return
        body = b"<html>maintenance</html>" if self.path == "/garbage" else json.dumps(
            {"carbonIntensity": 123, "datetime": "2022-01-01T00:00:00Z"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_endpoint_and_its_failures(http_server):
    pytest.importorskip("httpx")
    ok = HttpSource(f"{http_server}/latest", timeout_s=2.0)
    assert ok.read(0.0) == Reading(123.0, T0)
    ok.close()
    for path, message in (("/garbage", "not JSON"), ("/error", "HTTP 503"), ("/slow", "no answer within")):
        source = HttpSource(f"{http_server}{path}", timeout_s=0.2)
        guard = GuardedSignal(source, timeout_s=2.0, stale_after_s=None)
        polled = guard.poll(T0)
        assert polled.value is None and message in polled.error and "\n" not in polled.error
        guard.close()
    refused = HttpSource("http://127.0.0.1:9/", timeout_s=0.5)
    with pytest.raises(SignalError, match="http http://127.0.0.1:9/"):
        refused.read(0.0)
