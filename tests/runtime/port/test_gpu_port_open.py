"""``GPUPort.open`` takes the GPU and its clock path from the GPU layer (``perseus.gpu.clock_service``),
and the GPU layer's errors reach it unchanged (that the runtime names no clock service itself is
checked on the source in ``tests/test_layering.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.errors import ConfigError
from perseus.gpu.control.controller import NullController
from perseus.runtime.port.gpu_port import GPUPort


def _sim(tmp_path: Path, **kw: object) -> dict[str, object]:
    return {"state_dir": str(tmp_path / "sim"), "reset_state": True, "energy_update_period_s": 0.0, **kw}


def test_measure_only_changes_no_clock_whatever_clock_service_is_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("PERSEUS_CLOCKD_SOCKET", str(tmp_path / "no-daemon.sock"))
    port = GPUPort.open("sim", 0, _sim(tmp_path), control=False)
    try:
        assert isinstance(port.controller, NullController) and port.is_simulated
    finally:
        port.close()


def test_a_process_that_may_not_change_clocks_is_told_how_to_go_on(tmp_path, monkeypatch):
    monkeypatch.delenv("PERSEUS_CLOCKD_SOCKET", raising=False)
    monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET", raising=False)
    with pytest.raises(ConfigError, match="this process may not change the clocks of .*measure-only"):
        GPUPort.open("sim", 0, _sim(tmp_path, allow_clock_setting=False), control=True)
