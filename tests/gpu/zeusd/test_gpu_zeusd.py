"""The zeusd backend against a fake zeusd on a real Unix socket: routes, selection, refusals.

The clock-safety tests (exception, SIGTERM, SIGINT, SIGKILL of the trainer, a dead controller, a
stalled daemon) run against it in ``test_gpu_controller.py`` (its ``backend`` fixture); the
runtime's end-to-end run through it is in ``tests/runtime/test_zeusd_runtime.py``.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from fake_zeusd import FakeZeusd
from perseus.errors import ConfigError
from perseus.gpu import GPUError, GPUPermissionError, SimulatedGPU, read_sim_state
from perseus.gpu.control.controller import FrequencyController
from perseus.gpu.factory import open_gpu, open_spec
from perseus.gpu.zeusd.client import ZeusdClient, ZeusdRefusedError
from perseus.gpu.zeusd.device import ZeusdGPU

pytest.importorskip("httpx")  # the [zeusd] extra (in [dev])
CONTROL = ("alice", ["gpu-read", "gpu-control"])
READ_ONLY = ("bob", ["gpu-read"])


@pytest.fixture
def gpu(sim_dir):
    g = SimulatedGPU(0, preset="A100-SXM", reset_state=True)
    yield g
    g.close()


@pytest.fixture
def zeusd(sim_dir, sock_dir, gpu, monkeypatch):
    monkeypatch.delenv("ZEUSD_TOKEN", raising=False)
    monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET", raising=False)
    started: list[FakeZeusd] = []

    def start(**kwargs) -> FakeZeusd:
        fake = FakeZeusd(sock_dir / f"z{len(started)}.sock", sim_dir=sim_dir, **kwargs).start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


def test_clocks_energy_and_power_go_through_the_documented_routes(zeusd, gpu):
    z = zeusd()
    dev = open_gpu("sim", 0, zeusd_socket=z.socket_path)
    assert isinstance(dev, ZeusdGPU) and dev.can_set_clocks()
    dev.set_locked_sm_clock(1005)
    assert gpu.locked_sm_clock_mhz() == 1005 and dev.locked_sm_clock_mhz() == 1005
    assert z.calls("/gpu/set_gpu_locked_clocks") == [
        {"gpu_ids": "0", "min_clock_mhz": "1005", "max_clock_mhz": "1005", "block": "true"}]
    dev.reset_locked_sm_clock()
    assert not gpu.is_clock_locked()
    assert z.calls("/gpu/reset_gpu_locked_clocks") == [{"gpu_ids": "0", "block": "true"}]
    # the counter advances every period: zeusd's reading lies between two direct ones around it (a
    # loaded machine once put a period boundary between zeusd's read and one direct read after it)
    deadline = time.monotonic() + 5.0
    while gpu.total_energy_j() <= 0 and time.monotonic() < deadline:  # past the first update: not 0 == 0
        time.sleep(0.02)
    before = gpu.total_energy_j()
    assert before > 0
    via_zeusd = dev.total_energy_j()
    after = gpu.total_energy_j()
    assert before - 0.002 <= via_zeusd <= after + 0.002  # zeusd's counter is in mJ
    assert dev.power_w() == pytest.approx(gpu.power_w(), abs=0.002)
    assert z.calls("/gpu/get_cumulative_energy") == [{"gpu_ids": "0"}]
    assert z.calls("/gpu/get_power") == [{"gpu_ids": "0"}]
    dev.set_power_limit_w(300)
    assert z.calls("/gpu/set_power_limit") == [{"gpu_ids": "0", "power_limit_mw": "300000", "block": "true"}]
    assert gpu.power_limit_w() == 300
    dev.close()


def test_selected_by_the_environment_and_carried_by_the_spec(zeusd, gpu, monkeypatch):
    z = zeusd()
    assert not isinstance(open_gpu("sim", 0), ZeusdGPU)  # nothing set: the device itself
    monkeypatch.setenv("PERSEUS_ZEUSD_SOCKET", z.socket_path)
    dev = open_gpu("sim", 0)
    assert isinstance(dev, ZeusdGPU)
    spec = dev.spec()
    assert spec.zeusd_socket == z.socket_path
    assert type(spec).from_json(spec.to_json()) == spec  # what the controller process receives
    monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET")
    assert isinstance(open_spec(spec), ZeusdGPU)  # the spec, not the environment, decides there
    assert not isinstance(open_gpu("sim", 0, zeusd_socket=""), ZeusdGPU)


def test_older_discover_answer_is_understood(zeusd):
    z = zeusd(legacy_discover=True)
    assert ZeusdClient(z.socket_path).control_problem(0) is None
    assert "not GPU 3" in ZeusdClient(z.socket_path).control_problem(3)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_missing_socket_or_a_file_that_is_no_socket_is_one_line(sock_dir, gpu):
    missing = str(sock_dir / "nothing.sock")
    with pytest.raises(GPUError) as err:
        open_gpu("sim", 0, zeusd_socket=missing)
    text = _one_line(err.value)
    assert missing in text and "PERSEUS_ZEUSD_SOCKET" in text and "zeusd_socket" in text
    plain = sock_dir / "file"
    plain.write_text("")
    with pytest.raises(GPUError, match="is not a socket"):
        open_gpu("sim", 0, zeusd_socket=str(plain))
    dead = sock_dir / "dead.sock"  # a socket file nobody serves (zeusd killed)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    dev = open_gpu("sim", 0, zeusd_socket=str(dead))
    with pytest.raises(GPUError) as err:
        dev.set_locked_sm_clock(1005)
    assert "cannot talk to zeusd" in _one_line(err.value)


def test_auth_refusals_name_the_token_and_the_scope(zeusd, gpu, monkeypatch):
    z = zeusd(tokens={"t-control": CONTROL, "t-read": READ_ONLY})
    no_token = ZeusdGPU(SimulatedGPU(0), z.socket_path)
    assert "requires a token; set ZEUSD_TOKEN" in no_token.control_problem()
    with pytest.raises(ZeusdRefusedError) as err:
        no_token.set_locked_sm_clock(1005)
    assert "HTTP 401" in _one_line(err.value) and "ZEUSD_TOKEN" in str(err.value) and "'gpu-control'" in str(err.value)

    monkeypatch.setenv("ZEUSD_TOKEN", "t-read")
    read_only = ZeusdGPU(SimulatedGPU(0), z.socket_path)
    assert "'gpu-control'" in read_only.control_problem() and "['gpu-read']" in read_only.control_problem()
    assert read_only.total_energy_j() >= 0  # reading needs gpu-read only
    with pytest.raises(ZeusdRefusedError) as err:
        read_only.set_locked_sm_clock(1005)
    assert "HTTP 403" in _one_line(err.value) and "with the 'gpu-control' scope" in str(err.value)
    assert isinstance(err.value, GPUPermissionError)  # callers may fall back to measure-only

    monkeypatch.setenv("ZEUSD_TOKEN", "forged")
    with pytest.raises(ZeusdRefusedError, match="invalid or expired"):
        ZeusdGPU(SimulatedGPU(0), z.socket_path).set_locked_sm_clock(1005)

    monkeypatch.setenv("ZEUSD_TOKEN", "t-control")
    allowed = ZeusdGPU(SimulatedGPU(0), z.socket_path)
    assert allowed.control_problem() is None
    allowed.set_locked_sm_clock(1005)
    assert gpu.locked_sm_clock_mhz() == 1005
    allowed.reset_locked_sm_clock()


def test_a_disabled_api_group_and_a_daemon_without_privilege_are_named(zeusd, gpu):
    read_only_daemon = zeusd(enabled=("gpu-read",))
    dev = ZeusdGPU(SimulatedGPU(0), read_only_daemon.socket_path)
    assert "'gpu-control' API group disabled (enabled: gpu-read)" in dev.control_problem()
    with pytest.raises(ZeusdRefusedError, match=r"HTTP 404.*'gpu-control' API group disabled"):
        dev.set_locked_sm_clock(1005)
    unprivileged = zeusd(no_permission=(0,))
    with pytest.raises(ZeusdRefusedError) as err:
        ZeusdGPU(SimulatedGPU(0), unprivileged.socket_path).set_locked_sm_clock(1005)
    assert "GPU 0: NVML error: Insufficient Permissions" in _one_line(err.value) and "run zeusd as root" in str(err.value)
    assert not gpu.is_clock_locked()


def test_the_controller_refuses_to_start_with_zeusds_one_line(zeusd, gpu, monkeypatch):
    z = zeusd(tokens={"t-read": READ_ONLY})
    monkeypatch.setenv("ZEUSD_TOKEN", "t-read")  # inherited by the controller process
    spec = ZeusdGPU(SimulatedGPU(0), z.socket_path).spec()
    with pytest.raises(GPUPermissionError) as err:
        FrequencyController(spec, install_signal_handlers=False).start()
    assert "'gpu-control'" in _one_line(err.value) and "HTTP 403" in str(err.value)
    assert "ZEUSD_TOKEN" not in spec.to_json() and "t-read" not in spec.to_json()  # never on a command line


def test_the_runtime_port_says_what_zeusd_refused(zeusd, gpu, monkeypatch):
    from perseus.runtime.port.gpu_port import GPUPort

    z = zeusd(tokens={"t-read": READ_ONLY})
    monkeypatch.setenv("ZEUSD_TOKEN", "t-read")
    with pytest.raises(ConfigError) as err:
        GPUPort.open("sim", 0, {}, control=True, zeusd_socket=z.socket_path)
    assert "'gpu-control'" in _one_line(err.value)
    port = GPUPort.open("sim", 0, {}, control=False, zeusd_socket=z.socket_path)  # measure-only: reads only
    assert port.energy_j() >= 0 and port.is_simulated
    port.close()
    monkeypatch.setenv("PERSEUS_CLOCKD_SOCKET", os.fspath(z.socket_path))
    with pytest.raises(ConfigError, match="choose one clock service"):
        GPUPort.open("sim", 0, {}, control=True, zeusd_socket=z.socket_path)


def test_the_runtime_port_changes_clocks_through_zeusd_and_resets_on_close(zeusd, gpu, sim_dir):
    from perseus.runtime.port.gpu_port import GPUPort

    z = zeusd()
    port = GPUPort.open("sim", 0, {}, control=True, zeusd_socket=z.socket_path)
    port.apply(1200)
    assert read_sim_state(0, sim_dir).locked_mhz == 1200
    port.request(1005)  # the hook's call: a pipe write, no HTTP on this thread
    port.controller.flush()
    assert gpu.locked_sm_clock_mhz() == 1005
    port.close()
    assert not gpu.is_clock_locked()
    locks = [p["max_clock_mhz"] for p in z.calls("/gpu/set_gpu_locked_clocks")]
    assert locks[:2] == ["1200", "1005"] and set(locks[1:]) == {"1005"}  # the refused lock was retried, 900 never sent


def test_a_refusal_mid_run_is_one_failed_notice_and_training_goes_on(zeusd, gpu, monkeypatch):
    """The token is revoked or expires while training (zeusd answers 401 from then on): the
    controller process gives up on clock control with one ``failed`` notice naming the refusal, as
    for a device that refuses a lock, and training goes on without an exception. zeusd refuses
    the reset as well, so the notice says the GPU was not reset."""
    z = zeusd(tokens={"t-control": CONTROL})
    monkeypatch.setenv("ZEUSD_TOKEN", "t-control")
    spec = ZeusdGPU(SimulatedGPU(0), z.socket_path).spec()
    with FrequencyController(spec, install_signal_handlers=False) as c:
        c.set_frequency(1200)
        assert c.flush().current == 1200 and gpu.locked_sm_clock_mhz() == 1200
        del z.tokens["t-control"]
        c.set_frequency(1005)
        c.flush()
        notices = []
        deadline = time.monotonic() + 10.0  # a hang guard: the refusal is retried for about 2 s first
        while not notices and time.monotonic() < deadline:
            time.sleep(0.05)
            notices = c.notices()
        assert [n.kind for n in notices] == ["failed"]
        assert "HTTP 401" in notices[0].message and "ZEUSD_TOKEN" in notices[0].message
        assert notices[0].reset is False  # zeusd refuses the reset too: the notice says so (docs/gpu.md)
        c.set_frequency(900)  # ignored from now on, never raises
        c.flush()
    locks = [p["max_clock_mhz"] for p in z.calls("/gpu/set_gpu_locked_clocks")]
    assert locks[:2] == ["1200", "1005"] and set(locks[1:]) == {"1005"}  # the refused lock was retried, 900 never sent
