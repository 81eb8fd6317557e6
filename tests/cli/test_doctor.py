"""``perseus doctor``: its mode and exit status from the node's facts, and that it changes nothing."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

from fake_pynvml import FakeDevice, make_fake_pynvml

from perseus.cli import main
from perseus.gpu.nvml.readonly import is_read_only_call

CAP_SYS_ADMIN = "CapEff:\t0000000000200000\n"
NO_CAPS = "CapEff:\t0000000000000000\n"


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PERSEUS_GPU", "PERSEUS_CLOCKD_SOCKET", "PERSEUS_ZEUSD_SOCKET", "CUDA_VISIBLE_DEVICES", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PERSEUS_CLAIM_DIR", str(tmp_path / "claims"))
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))


HOST_UID_MAP = "         0          0 4294967295\n"
REMAPPED_UID_MAP = "         0     100000      65536\n"  # enroot --container-remap-root, rootless docker


def privileges(monkeypatch: pytest.MonkeyPatch, *, euid: int, cap: bool, user_namespace: bool = False) -> None:
    monkeypatch.setattr("perseus.gpu.nvml.device.proc_status", lambda: CAP_SYS_ADMIN if cap else NO_CAPS)
    monkeypatch.setattr("perseus.gpu.nvml.device.proc_uid_map",
                        lambda: REMAPPED_UID_MAP if user_namespace else HOST_UID_MAP)
    monkeypatch.setattr(os, "geteuid", lambda: euid)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: NVML absent


def fake_gpus(monkeypatch: pytest.MonkeyPatch, *devices: FakeDevice):
    fake = make_fake_pynvml(list(devices))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def doctor(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict]:
    code = main(["doctor", "--json", "--quick", *flags])
    return code, json.loads(capsys.readouterr().out)


def mode_finding(report: dict) -> dict:
    return next(f for f in report["findings"] if f["check"] == "mode")


def test_without_nvml_both_forms_run_and_say_unavailable(no_nvml, capsys):
    assert main(["doctor", "--quick"]) == 2
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("FAIL  NVML") and "unavailable" in table
    code, report = doctor(capsys)
    assert code == 2 and report["mode"] == "unavailable" and report["gpus"] == []
    assert all(set(f) == {"check", "status", "detail", "fix"} for f in report["findings"])
    assert {"NVML", "privileges", "clockd", "zeusd", "claim directory", "torch", "frameworks"} <= {
        f["check"] for f in report["findings"]}


def test_the_simulated_gpu_runs(no_nvml, monkeypatch, capsys):
    monkeypatch.setenv("PERSEUS_GPU", "sim")
    code, report = doctor(capsys)
    assert code == 0 and report["mode"] == "run"
    assert any(f["check"] == "simulated GPU" for f in report["findings"])
    assert next(f for f in report["findings"] if f["check"] == "NVML")["status"] == "WARN"


def test_mig_means_measure_only_with_the_mig_fix(monkeypatch, capsys):
    fake_gpus(monkeypatch, FakeDevice("GPU-aaaa", mig_enabled=True))
    privileges(monkeypatch, euid=0, cap=True)
    code, report = doctor(capsys)
    assert code == 1 and report["mode"] == "measure-only"
    assert "-mig 0" in mode_finding(report)["fix"] and "without_clock_access" in mode_finding(report)["detail"]
    assert report["gpus"][0]["mig"] is True


def test_root_without_cap_sys_admin_is_measure_only_naming_the_capability(monkeypatch, capsys):
    fake_gpus(monkeypatch, FakeDevice("GPU-aaaa"))
    privileges(monkeypatch, euid=0, cap=False)
    code, report = doctor(capsys)
    assert code == 1 and report["mode"] == "measure-only"
    priv = next(f for f in report["findings"] if f["check"] == "privileges")
    assert "root without CAP_SYS_ADMIN" in priv["detail"]
    assert "SYS_ADMIN" in mode_finding(report)["fix"] and "clockd" in mode_finding(report)["fix"]


def test_root_in_a_user_namespace_with_every_capability_is_measure_only(monkeypatch, capsys):
    """A remapped container's root holds CAP_SYS_ADMIN inside its namespace only: the driver refuses it."""
    fake_gpus(monkeypatch, FakeDevice("GPU-aaaa"))
    privileges(monkeypatch, euid=0, cap=True, user_namespace=True)
    code, report = doctor(capsys)
    assert code == 1 and report["mode"] == "measure-only"
    priv = next(f for f in report["findings"] if f["check"] == "privileges")
    assert priv["status"] == "WARN" and "user namespace" in priv["detail"] and "clockd" in priv["fix"]


def test_an_unprivileged_user_is_measure_only_not_probed(monkeypatch, capsys):
    fake = fake_gpus(monkeypatch, FakeDevice("GPU-aaaa"))
    privileges(monkeypatch, euid=1000, cap=False)
    code, report = doctor(capsys)
    assert code == 1 and "not probed" in mode_finding(report)["detail"]
    assert not fake.calls_named("nvmlDeviceSetGpuLockedClocks")


def test_with_the_capability_run_mode_and_no_set_or_reset_call(monkeypatch, capsys):
    fake = fake_gpus(monkeypatch, FakeDevice("GPU-aaaa", energy_step_s=0.02),
                     FakeDevice("GPU-bbbb", name="NVIDIA H100 80GB HBM3", arch=9, energy_step_s=0.02))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    privileges(monkeypatch, euid=0, cap=True)
    code = main(["doctor", "--json"])  # not --quick: the energy counter is polled
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["mode"] == "run"
    [gpu] = report["gpus"]
    assert gpu["index"] == 1 and gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["power_limit_w"] == 400.0
    assert gpu["power_limit_range_w"] == [100.0, 400.0] and gpu["energy_counter_period_s"] == pytest.approx(0.02, abs=0.01)
    called = {name for name, _ in fake.calls}
    assert called and all(is_read_only_call(name) for name in called), called
    assert fake.devices[1].locked is None and fake.devices[1].power_limit_mw == 400_000


def test_a_lock_in_force_or_another_claim_is_measure_only(monkeypatch, capsys, tmp_path):
    fake = fake_gpus(monkeypatch, FakeDevice("GPU-aaaa", clock_event_reasons=0x2))
    privileges(monkeypatch, euid=0, cap=True)
    code, report = doctor(capsys)
    assert code == 1 and "already locked" in mode_finding(report)["detail"]
    fake.devices[0].clock_event_reasons = 0x4
    (tmp_path / "claims").mkdir()
    claim = tmp_path / "claims" / "GPU-aaaa.claim"
    claim.write_text("4242\n")
    with open(claim) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, report = doctor(capsys)
    assert code == 1 and "pid 4242" in mode_finding(report)["detail"]
    assert doctor(capsys)[0] == 0  # released: run


def test_clockd_reachable_runs_and_unreachable_is_measure_only(monkeypatch, capsys, tmp_path):
    fake_gpus(monkeypatch, FakeDevice("GPU-aaaa"))
    privileges(monkeypatch, euid=1000, cap=False)
    path = f"/tmp/doctor-{os.getpid()}.sock"  # AF_UNIX paths are short
    monkeypatch.setenv("PERSEUS_CLOCKD_SOCKET", path)
    code, report = doctor(capsys)
    assert code == 1 and "clockd is not reachable" in mode_finding(report)["detail"]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(1)
        code, report = doctor(capsys)
    finally:
        server.close()
        os.unlink(path)
    assert code == 0 and report["mode"] == "run"


def test_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert "exit status: 0 run mode" in out and "never changes a clock" in out
