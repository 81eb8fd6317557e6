"""Shared fixtures for GPU-layer tests: an isolated simulated-GPU state dir and a fake pynvml."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_pynvml import FakeDevice, make_fake_pynvml


@pytest.fixture
def sim_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own simulated GPUs (state files live here)."""
    d = tmp_path / "simgpu"
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(d))
    monkeypatch.delenv("PERSEUS_GPU", raising=False)
    return d


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):
    """Install a fake pynvml with three A100s; returns the module (configure ``.devices``)."""
    fake = make_fake_pynvml([
        FakeDevice("GPU-aaaa1111-0000-0000-0000-000000000000"),
        FakeDevice("GPU-bbbb2222-0000-0000-0000-000000000000"),
        FakeDevice("GPU-bbbc3333-0000-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3", arch=9),
    ])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("PERSEUS_GPU", raising=False)
    return fake


@pytest.fixture
def sock_dir():
    """A short temporary folder for Unix sockets (AF_UNIX paths are limited to 107 bytes)."""
    d = tempfile.mkdtemp(prefix="clockd-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)
