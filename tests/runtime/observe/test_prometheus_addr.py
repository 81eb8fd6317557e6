"""Where the Prometheus exporters listen: 127.0.0.1 unless the config's ``prometheus_addr`` says
otherwise (0.0.0.0, ::, a host name), so a cluster's Prometheus can scrape them when asked to."""

from __future__ import annotations

import socket
import urllib.request
from types import SimpleNamespace

import pytest

from perseus.errors import ConfigError
from perseus.runtime.config import PerseusConfig

pytest.importorskip("prometheus_client")
from perseus.runtime.observe.observer import Observer
from perseus.runtime.observe.prometheus import PrometheusExporter

LOCAL = SimpleNamespace(all_true=lambda flag: flag)  # a one-rank job's agreement


def _started(config: dict) -> Observer:
    observer = Observer(0, PerseusConfig.from_dict({"cache_dir": None, "log_every_steps": 0, **config}), True)
    observer.start_prometheus(0, LOCAL)  # type: ignore[arg-type]  # the only collective call it makes
    return observer


def test_the_exporter_listens_on_loopback_by_default():
    assert PerseusConfig().prometheus_addr == "127.0.0.1"
    observer = _started({})
    try:
        assert observer.prometheus._server.server_address[0] == "127.0.0.1"
    finally:
        observer.close()


def test_the_configured_address_is_where_the_exporter_listens():
    observer = _started({"prometheus_addr": "0.0.0.0"})
    try:
        exporter = observer.prometheus
        assert exporter.addr == "0.0.0.0" and exporter._server.server_address[0] == "0.0.0.0"
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as resp:
            assert b"perseus_phase" in resp.read()  # every interface, loopback included
    finally:
        observer.close()


def test_an_ipv6_address_is_bracketed_in_the_url():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        exporter = PrometheusExporter(port=0, addr="::1")
    except Exception as exc:  # noqa: BLE001 - a host without an IPv6 loopback refuses in its own way
        pytest.skip(f"cannot listen on ::1 here ({exc})")
    with exporter:
        assert exporter.url == f"http://[::1]:{exporter.port}/metrics"
        with urllib.request.urlopen(exporter.url, timeout=10) as resp:
            assert resp.status == 200


@pytest.mark.parametrize("addr", ["0.0.0.0:9400", "http://0.0.0.0", "", "two words", 9400])
def test_a_bad_address_is_one_line_naming_the_field(addr):
    with pytest.raises(ConfigError, match=r"^invalid perseus config: prometheus_addr: .*e\.g\. 127\.0\.0\.1") as info:
        PerseusConfig.from_dict({"prometheus_addr": addr})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("addr", ["0.0.0.0", "::", "10.1.2.3", "node-7.cluster.local", "localhost"])
def test_addresses_and_host_names_are_accepted(addr):
    assert PerseusConfig.from_dict({"prometheus_addr": addr}).prometheus_addr == addr
