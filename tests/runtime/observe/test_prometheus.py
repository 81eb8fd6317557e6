"""Prometheus exporter: served on a free local port, updated from snapshots, scraped like Prometheus would."""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request

import pytest

from perseus.errors import PerseusError

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from perseus.runtime.observe.prometheus import PrometheusExporter


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_exporter_serves_what_the_snapshots_say_and_frees_its_port():
    exporter = PrometheusExporter(port=0)
    try:
        assert exporter.port > 0 and exporter.url == f"http://127.0.0.1:{exporter.port}/metrics"
        exporter.update({"phase": "profiling", "clock_mhz": 1410, "energy_total_j": {"0": 100.0, "1": 80.0},
                         "instructions_total": {1410: 16}})
        first = _scrape(exporter.url)
        assert first[("perseus_phase", (("phase", "profiling"),))] == 1
        assert first[("perseus_phase", (("phase", "deployed"),))] == 0
        assert first[("perseus_clock_mhz", ())] == 1410
        assert first[("perseus_energy_joules_total", (("gpu", "0"),))] == 100.0
        assert first[("perseus_instructions_total", (("clock_mhz", "1410"),))] == 16

        exporter.update({"phase": "deployed", "clock_mhz": 1200, "energy_total_j": {"0": 150.5, "1": 120.0},
                         "instructions_total": {1410: 20, 1200: 12}, "point_slowdown": 1.0,
                         "point_energy_j": 101.25, "straggler_ratio": 1.0, "energy_saving": 0.093})
        second = _scrape(exporter.url)
        assert second[("perseus_phase", (("phase", "deployed"),))] == 1
        assert second[("perseus_phase", (("phase", "profiling"),))] == 0
        assert second[("perseus_clock_mhz", ())] == 1200
        assert second[("perseus_energy_joules_total", (("gpu", "0"),))] == 150.5  # counters follow the totals
        assert second[("perseus_energy_joules_total", (("gpu", "1"),))] == 120.0
        assert second[("perseus_instructions_total", (("clock_mhz", "1410"),))] == 20
        assert second[("perseus_instructions_total", (("clock_mhz", "1200"),))] == 12
        assert second[("perseus_deployed_point_slowdown", ())] == 1.0
        assert second[("perseus_deployed_point_energy_joules", ())] == 101.25
        assert second[("perseus_straggler_ratio", ())] == 1.0
        assert second[("perseus_energy_saving_ratio", ())] == pytest.approx(0.093)

        exporter.update({"energy_total_j": {"0": 10.0}, "straggler_ratio": None})  # source restarted: counts on
        third = _scrape(exporter.url)
        assert third[("perseus_energy_joules_total", (("gpu", "0"),))] == 160.5
        assert third[("perseus_straggler_ratio", ())] == 1.0  # None leaves a metric as it was
    finally:
        exporter.close()
    exporter.close()  # idempotent
    # The port is free again: a listener can take it (SO_REUSEADDR only skips the TIME_WAIT of the
    # scrapes' connections; it would not share a port that is still listening).
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", exporter.port))
        sock.listen()
    with pytest.raises(urllib.error.URLError):
        _scrape(exporter.url)


def test_bad_snapshots_and_ports_are_errors():
    with PrometheusExporter(port=0) as exporter:
        with pytest.raises(PerseusError, match="unknown key"):
            exporter.update({"clock": 1200})
        with pytest.raises(PerseusError, match="finite number"):
            exporter.update({"clock_mhz": float("nan")})
        with pytest.raises(PerseusError, match="cumulative total"):
            exporter.update({"energy_total_j": 12.0})
        with pytest.raises(PerseusError, match="cannot listen"):
            PrometheusExporter(port=exporter.port)  # taken
    with pytest.raises(PerseusError, match="port must be"):
        PrometheusExporter(port=70000)


def test_missing_prometheus_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as if not installed
    with pytest.raises(PerseusError, match=r"pip install -e '\.\[prometheus\]'"):
        PrometheusExporter(port=0)


def test_a_steps_work_between_steps_is_in_every_metric_writer():
    """Its own bucket: the metrics file's line, the scalar writers' names and Prometheus' gauges."""
    from perseus.runtime.observe.metrics import SCALARS, StepMetrics
    from perseus.runtime.observe.prometheus import SNAPSHOT_KEYS
    from perseus.runtime.phases import Phase

    record = StepMetrics(step=3, rank=0, phase=Phase.DEPLOYED, time_s=0.3, energy_j=90.0, between_steps_s=0.035,
                         between_steps_energy_j=17.5)
    assert record.file_row()["between_steps_s"] == 0.035 and record.file_row()["between_steps_energy_j"] == 17.5
    scalars = record.scalars()
    assert scalars["perseus/between_steps_s"] == 0.035 and scalars["perseus/between_steps_energy_j"] == 17.5
    assert {"between_steps_s", "between_steps_energy_j"} <= set(SCALARS) & SNAPSHOT_KEYS
    unmeasured = StepMetrics(step=4, rank=0, phase=Phase.DEPLOYED, time_s=0.3, energy_j=None, between_steps_s=0.03)
    assert "between_steps_energy_j" not in unmeasured.file_row() and "between_steps_energy_j" not in unmeasured.scalars()
    exporter = PrometheusExporter(port=0)
    try:
        exporter.update(record.prometheus())
        seen = _scrape(exporter.url)
        assert seen[("perseus_between_steps_seconds", ())] == 0.035
        assert seen[("perseus_between_steps_joules", ())] == 17.5
    finally:
        exporter.close()
