"""scripts/gpu_check.py: read-only by default (a guard refuses every NVML set/reset), one JSON
object or a markdown table, the NVML parts without CUDA, and clock checks that reset only what they
locked; plus the analysis it reports and the GPT-like stage it runs, on CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import NVML_ERROR_UNKNOWN, FakeDevice, make_fake_pynvml

from perseus.gpu import read_sim_state
from perseus.gpu.nvml.readonly import ReadOnlyNVML, ReadOnlyViolation, is_read_only_call

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
DEVICE_SCRIPT = ROOT / "scripts" / "gpu_check_device.sh"
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check
import gpu_check_analysis as an

CHANGING = ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks", "nvmlDeviceSetMemoryLockedClocks",
            "nvmlDeviceResetMemoryLockedClocks", "nvmlDeviceSetPowerManagementLimit")


def _changing_calls(fake: Any) -> list[str]:
    return [name for name, _ in fake.calls if not is_read_only_call(name)]


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fake pynvml with one A100 whose energy counter advances every 20 ms; no CUDA for torch."""
    fake = make_fake_pynvml([FakeDevice("GPU-aaaa1111-0000-0000-0000-000000000000", energy_step_s=0.02)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    for var in ("CUDA_VISIBLE_DEVICES", "PERSEUS_GPU", "PERSEUS_ZEUSD_SOCKET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(gpu_check, "cuda_unavailable", lambda: "no CUDA device visible to torch (test)")
    return fake


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str, str]:
    assert gpu_check.main(argv) == 0
    out = capsys.readouterr()
    return json.loads(out.out) if "--json" in argv else {}, out.out, out.err


# -- the guard ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CHANGING)
def test_guard_refuses_changes_before_they_reach_nvml(name: str) -> None:
    fake = make_fake_pynvml()
    nv = ReadOnlyNVML(fake)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(ReadOnlyViolation, match=f"{name} refused: this run is read-only"):
        getattr(nv, name)(h, 1410, 1410)
    assert fake.calls_named(name) == [] and nv.refused == [name]
    assert fake.devices[0].locked is None and fake.devices[0].power_limit_mw == 400_000


def test_guard_passes_queries_constants_and_errors_and_refuses_unknown_changers() -> None:
    fake = make_fake_pynvml()
    nv = ReadOnlyNVML(fake)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetPowerUsage(h) == 250_000 and nv.NVML_CLOCK_SM == 1 and nv.NVMLError is fake.NVMLError
    # not in the fake (nor called): refused by name all the same, not an AttributeError
    for name in ("nvmlDeviceSetPersistenceMode", "nvmlDeviceSetComputeMode", "nvmlDeviceClearEccErrorCounts",
                 "nvmlDeviceSetApplicationsClocks", "nvmlDeviceResetApplicationsClocks"):
        with pytest.raises(ReadOnlyViolation):
            getattr(nv, name)
    with pytest.raises(AttributeError):
        nv.nvmlDeviceGetNoSuchThing  # noqa: B018 - a missing query is just missing
    with pytest.raises(AttributeError):
        nv.nvmlDeviceSetGpuLockedClocks = lambda *a: None


# -- read-only mode ----------------------------------------------------------------------------------------
def test_read_only_default_never_calls_a_set_or_reset_and_reports_nvml(one_gpu: Any, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data, stdout, _ = _run(["--quick", "--json", "--out", str(tmp_path)], capsys)
    assert _changing_calls(one_gpu) == []
    assert {name for name, _ in one_gpu.calls} >= {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"}
    assert data["mode"] == "read-only" and data["errors"] == {} and data["read_only_guard"] == {"refused": []}
    assert set(data) >= {"schema", "identity", "versions", "clocks", "power", "read_latency", "counter", "cuda",
                         *gpu_check.CUDA_PARTS, "elapsed_s", "total_s"}
    assert data["identity"] == {"name": "NVIDIA A100-SXM4-40GB", "nvml_index": 0, "architecture": "ampere",
                                "memory_gib": 40.0}
    assert "GPU-" not in stdout  # no UUID anywhere
    assert data["versions"]["driver"] == "580.159.04" and data["versions"]["cuda_driver"] == "13.0"
    assert (data["clocks"]["sm_count"], data["clocks"]["sm_max_mhz"], data["clocks"]["sm_min_mhz"]) == (81, 1410, 210)
    assert data["power"]["limit_w"] == 400 and data["power"]["range_w"] == [100, 400]
    assert data["read_latency"]["energy_ms"]["n"] == 40 and data["read_latency"]["power_ms"]["n"] == 400
    assert data["counter"]["period_ms"]["n"] >= 4
    # the files: the same JSON, and the markdown table
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == data
    assert (tmp_path / "gpu_check.md").read_text().startswith("| check (read-only) | result |")


def test_no_cuda_is_one_clear_line_and_the_nvml_parts_still_report(one_gpu: Any,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    data, _, _ = _run(["--quick", "--json"], capsys)
    assert data["cuda"] == {"available": False, "reason": "no CUDA device visible to torch (test)"}
    assert all(data[name] is None for name in gpu_check.CUDA_PARTS)
    _, table, _ = _run(["--quick"], capsys)
    cuda_lines = [line for line in table.splitlines() if "CUDA" in line and not line.startswith(("| driver", "| python"))]
    assert cuda_lines == ["| CUDA parts | skipped: no CUDA device visible to torch (test) |"]
    assert "| supported SM clocks | 81, 210–1410 MHz |" in table
    assert "| power limit (range) | 400 W (100–400 W); idle now 250.0 W |" in table
    assert "0 part(s) failed" in table


def test_the_real_cuda_check_names_torch_when_it_has_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = gpu_check.cuda_unavailable()
    assert reason is not None and reason.startswith(f"no CUDA device visible to torch {torch.__version__}")
    assert "\n" not in reason


def test_only_runs_the_named_parts(one_gpu: Any, capsys: pytest.CaptureFixture[str]) -> None:
    data, _, _ = _run(["--quick", "--json", "--only", "versions"], capsys)
    assert "versions" in data and "identity" in data  # NVML opened for it
    assert not {"clocks", "power", "read_latency", "counter"} & set(data) and data["errors"] == {}
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "no_such_part"])
    assert "--only: no part named no_such_part" in capsys.readouterr().err


def test_the_side_stream_part_does_not_run_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    import gpu_check_cuda as cu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="side_stream needs a CUDA GPU .* it does not run on CPU"):
        cu.side_stream()
    assert "side_stream" in gpu_check.CUDA_PARTS


def test_the_side_stream_part_renders_one_row_per_case() -> None:
    span = {"n": 20, "median": 10.0, "p99": 10.1, "min": 9.9, "max": 10.1}
    early = {**span, "median": 0.02}
    case = {"current_stream": early, "compute_stream": span, "compute_stream_joined": span, "truth": span, "right": True}
    data = {"mode": "read-only", "errors": {}, "side_stream": {
        "idle_side_stream": case, "work_left_on_side_stream": {**case, "right": False},
        "current_stream_read_us": {"n": 200, "median": 0.4, "p99": 0.6},
        "record_on_current_us": {"n": 200, "median": 10.2, "p99": 25.1},
        "record_on_named_us": {"n": 200, "median": 2.7, "p99": 4.0}}}
    table = gpu_check.markdown(data)
    assert ("| instruction span, end hook under an idle side stream (ms) | truth 10.00; on the current stream 0.02, "
            "compute stream only 10.00, perseus (both) 10.00: right |") in table
    assert "side stream with the longer work (ms) | truth 10.00" in table and ": WRONG |" in table
    assert ("| host: current stream read / event on the current / on a named stream | 0.4 / 0.6 µs ; 10.2 / 25.1 µs ; "
            "2.7 / 4.0 µs |") in table


def test_a_part_that_tries_to_change_the_gpu_is_refused_recorded_and_the_rest_runs(
        one_gpu: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_check_nvml

    def greedy_power(nv: Any, handle: Any) -> dict[str, Any]:
        nv.nvmlDeviceSetPowerManagementLimit(handle, 300_000)
        return {}

    monkeypatch.setattr(gpu_check_nvml, "power", greedy_power)
    data, _, err = _run(["--quick", "--json"], capsys)
    assert data["power"] == {"error": data["errors"]["power"]}
    assert data["errors"]["power"].startswith("ReadOnlyViolation: nvmlDeviceSetPowerManagementLimit refused")
    assert data["read_only_guard"]["refused"] == ["nvmlDeviceSetPowerManagementLimit"]
    assert _changing_calls(one_gpu) == [] and one_gpu.devices[0].power_limit_mw == 400_000
    assert data["counter"]["period_ms"]["n"] >= 4  # later parts still ran
    assert "gpu_check: power failed: ReadOnlyViolation" in err


def test_without_nvml_each_nvml_part_says_so_and_the_json_is_still_written(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(init_error=12))
    monkeypatch.setattr(gpu_check, "cuda_unavailable", lambda: "no CUDA (test)")
    data, _, _ = _run(["--quick", "--json", "--out", str(tmp_path)], capsys)
    assert data["identity"]["error"].startswith("NVMLError_LibraryNotFound")
    assert data["clocks"] == {"error": "RuntimeError: NVML did not open (see 'identity'); this part needs it"}
    assert data["versions"]["python"] and "nvml_error" in data["versions"]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["errors"] == data["errors"]
    assert "| clocks | **failed**: RuntimeError: NVML did not open" in (tmp_path / "gpu_check.md").read_text()


def test_render_prints_the_table_of_an_earlier_json(one_gpu: Any, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _run(["--quick", "--json", "--out", str(tmp_path)], capsys)
    table = (tmp_path / "gpu_check.md").read_text()
    (tmp_path / "gpu_check.md").unlink()
    _, again, _ = _run(["--render", str(tmp_path / "gpu_check.json"), "--out", str(tmp_path)], capsys)
    assert again.strip() == table.strip() == (tmp_path / "gpu_check.md").read_text().strip()


# -- clock changes -----------------------------------------------------------------------------------------
def test_allow_clock_changes_resets_only_what_it_locked(one_gpu: Any, capsys: pytest.CaptureFixture[str]) -> None:
    data, _, _ = _run(["--allow-clock-changes", "--quick", "--json"], capsys)
    cc = data["clock_changes"]
    assert data["mode"] == "allow-clock-changes" and cc["can_set_clocks"] and cc["lock_latency"]["reps"] == 20
    assert "no CUDA device visible" in cc["matmul"]["error"]  # the sweep needs CUDA; the rest stands
    locks = one_gpu.calls_named("nvmlDeviceSetGpuLockedClocks")
    resets = one_gpu.calls_named("nvmlDeviceResetGpuLockedClocks")
    assert len(locks) >= 20 and len(resets) == len(locks) and one_gpu.devices[0].locked is None
    # the memory clock was never locked, so it is never reset; no power limit touched
    assert one_gpu.calls_named("nvmlDeviceSetMemoryLockedClocks") == []
    assert one_gpu.calls_named("nvmlDeviceResetMemoryLockedClocks") == []
    assert one_gpu.calls_named("nvmlDeviceSetPowerManagementLimit") == []
    # and the read-only parts ran first, before any lock
    names = [name for name, _ in one_gpu.calls]
    assert names.index("nvmlSystemGetDriverVersion") < names.index("nvmlDeviceSetGpuLockedClocks")


def test_a_failed_lock_is_still_reset_and_the_memory_clock_left_alone(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = make_fake_pynvml([FakeDevice("GPU-aaaa1111-0000-0000-0000-000000000000", energy_step_s=0.02)],
                            lock_error=NVML_ERROR_UNKNOWN)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_check, "cuda_unavailable", lambda: "no CUDA (test)")
    data, _, _ = _run(["--allow-clock-changes", "--quick", "--json"], capsys)
    assert "NVML error 999" in data["errors"]["clock_changes"]
    names = [n for n, _ in fake.calls if n.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]
    assert names[-1] == "nvmlDeviceResetGpuLockedClocks" and fake.devices[0].locked is None
    assert not any("Memory" in n for n in names)


class _RecordingDevice:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def set_locked_sm_clock(self, mhz: int) -> None:
        self.calls.append(f"lock {mhz}")

    def reset_locked_sm_clock(self) -> None:
        self.calls.append("reset")

    def reset_memory_clock(self) -> None:
        self.calls.append("reset memory")

    def can_set_clocks(self) -> bool:
        self.calls.append("probe")
        return True


def test_clock_changes_restore_does_nothing_when_nothing_was_locked() -> None:
    dev = _RecordingDevice()
    changes = gpu_check.ClockChanges(dev)
    assert changes.restore() is None and dev.calls == []
    changes.lock_sm(1410)
    changes.reset_sm()
    assert changes.restore() is None and dev.calls == ["lock 1410", "reset"]
    changes.lock_sm(1200)
    assert changes.restore() is None and dev.calls[-1] == "reset"
    assert "reset memory" not in dev.calls


def test_gpu_check_sim_quick(sim_dir: Path, tmp_path: Path) -> None:
    """The clock checks on the simulated GPU, end to end in a process of its own."""
    env = {**os.environ, "PERSEUS_SIM_GPU_DIR": str(sim_dir)}
    p = subprocess.run([sys.executable, str(SCRIPT), "--sim", "--quick", "--out", str(tmp_path)],
                       env=env, check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "| clock checks on | NVIDIA A100-SXM4-40GB (simulated) (ampere) [sim] |" in p.stdout
    assert "| SM clocks | 81 from 1410 down to 210 MHz |" in p.stdout
    data = json.loads((tmp_path / "gpu_check.json").read_text())["clock_changes"]
    assert data["can_set_clocks"] and data["lock_latency"]["reps"] == 20
    # measured by polling, so a busy machine blurs it; the simulated counter's period is 100 ms
    assert 50 < data["energy_counter"]["median_ms"] < 400
    rows = data["matmul"]
    assert [r["sm_clock_mhz"] for r in rows][0] == 1410 and len(rows) == 4
    powers = [r["power_w"] for r in rows]
    assert powers[0] == max(powers) and powers[-1] == min(powers) and powers[0] <= 400
    st = read_sim_state(0, sim_dir)
    assert st.locked == 0 and st.n_lock > 0  # clocks were changed, and reset at the end


def test_gpu_check_runs_megatrons_combined_1f1b_with_the_hooks(sim_dir: Path, tmp_path: Path) -> None:
    """The --combined-1f1b case's path on the simulated GPU (streams stubbed; CUDA only on a GPU)."""
    pytest.importorskip("megatron.core")
    env = {**os.environ, "PERSEUS_SIM_GPU_DIR": str(sim_dir)}
    p = subprocess.run([sys.executable, str(SCRIPT), "--sim", "--quick", "--combined-1f1b", "--out", str(tmp_path)],
                       env=env, check=False, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "hooks report F0 F1+B0 F2+B1 F3+B2 B3: matches megatron-combined-1f1b" in p.stdout
    data = json.loads((tmp_path / "gpu_check.json").read_text())["clock_changes"]["combined_1f1b"]
    assert data["order_matches"] and set(data["unit_ms"]) == {"forward", "forward_backward", "backward"}


# -- the device command ------------------------------------------------------------------------------------
def test_device_script_runs_the_read_only_check_bounded_and_hides_ids(tmp_path: Path) -> None:
    """With a stand-in nvidia-smi and python3 (no GPU here): read-only flags, timeouts, ids filtered."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho \"Driver Version : 580\"\necho \"GPU UUID : GPU-1234\"\n"
                                        "echo \"Serial Number : 99\"\necho \"Product Name : NVIDIA H100\"\n")
    (bin_dir / "fakepy").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                                    "case \"$*\" in *--render*) echo '| check | result |';; "
                                    "*) echo '{}' > \"$5/gpu_check.json\";; esac\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": "fakepy", "OUT": str(tmp_path / "out")}
    p = subprocess.run(["bash", str(DEVICE_SCRIPT)], env=env, check=False, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Driver Version : 580" in p.stdout and "Product Name : NVIDIA H100" in p.stdout
    assert "UUID" not in p.stdout and "Serial" not in p.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == f"scripts/gpu_check.py --read-only --json --out {tmp_path / 'out'}"
    assert calls[1] == "-m perseus.cli doctor --json"
    assert calls[2:4] == ["scripts/gpu_runtime_check.py --steps 24",
                          "scripts/gpu_runtime_check.py --steps 24 --hidden 256 --seq 256"]
    assert calls[4].startswith("scripts/gpu_check.py --render") and p.stdout.rstrip().endswith("| check | result |")
    assert "allow-clock-changes" not in DEVICE_SCRIPT.read_text()
    assert DEVICE_SCRIPT.read_text().count("timeout -k") == 7


# -- the analysis ------------------------------------------------------------------------------------------
def test_one_f_one_b_order_of_one_stage() -> None:
    order = " ".join(i.short() for i in an.one_f_one_b_order(8, 3))
    assert order == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    with pytest.raises(ValueError):
        an.one_f_one_b_order(2, 3)


def _timeline(n: int, dur: float) -> tuple[list[float], list[float]]:
    begin = [i * dur for i in range(n)]
    return begin, [b + dur for b in begin]


def test_run_ahead_counts_unfinished_instructions_at_each_hook() -> None:
    begin, end = _timeline(10, 0.010)
    hooks = [0.0] * 10  # the host enqueued everything at once
    ahead = an.run_ahead(hooks, begin, end)
    assert ahead["instructions"]["max"] == 9 and ahead["ms"]["max"] == pytest.approx(90.0)
    on_time = an.run_ahead([b + 1e-6 for b in begin], begin, end)  # each hook as its instruction starts
    assert on_time["instructions"]["max"] == 0 and on_time["ms"]["max"] == pytest.approx(-1e-3)


def test_own_clock_share_hook_requests_that_run_ahead_land_early() -> None:
    begin, end = _timeline(20, 0.010)
    ahead5 = [b - 0.050 for b in begin]  # requested 5 instructions early: each lands on an earlier one
    assert an.own_clock_shares(begin, end, ahead5)["instructions"] == 0.0
    follower = [-math.inf] + [e + 100e-6 for e in end[:-1]]  # 100 µs after the previous one ends
    at0 = an.own_clock_shares(begin, end, follower)
    assert at0["instructions"] == 1.0 and at0["time_share"] == pytest.approx(0.99)  # 100 µs of each 10 ms
    late = an.own_clock_shares(begin, end, [t + 0.006 for t in follower])  # 6 ms switch latency: under half
    assert late["instructions"] == 0.0 and late["time_share"] == pytest.approx(0.4 - 0.01, abs=1e-9)


def test_counter_updates_and_period() -> None:
    polls = [(t * 0.01, t * 0.01 + 0.002, float(t // 10)) for t in range(55)]
    ups = an.counter_updates(polls)
    assert [v for _, v in ups] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ups[0][0] == pytest.approx(0.5 * (0.092 + 0.102))
    assert an.update_period(ups)["median"] == pytest.approx(100.0)


def test_attribute_power_recovers_known_powers_and_reports_errors() -> None:
    # forward 600 W for 20 ms, backward 400 W for 50 ms, then 30 ms of other work at 200 W, repeated
    spans, t, energy = [], 0.0, 0.0
    profile = []
    for _ in range(60):
        spans += [("forward", t, t + 0.020), ("backward", t + 0.020, t + 0.070)]
        profile += [(t, 600.0), (t + 0.020, 400.0), (t + 0.070, 200.0)]
        t += 0.100
    updates = []
    for k in range(1, int(t / 0.033)):  # a counter that updates every 33 ms, out of phase with the steps
        tk = k * 0.033
        energy = sum(p * max(0.0, min(tk, (profile[j + 1][0] if j + 1 < len(profile) else t)) - s)
                     for j, (s, p) in enumerate(profile))
        updates.append((tk, energy))
    res = an.attribute_power(updates, spans)
    assert res["forward"]["power_w"] == pytest.approx(600, rel=1e-6)
    assert res["backward"]["power_w"] == pytest.approx(400, rel=1e-6)
    assert res["other"]["power_w"] == pytest.approx(200, rel=1e-6)
    assert res["forward"]["stderr_w"] < 1e-3
    with pytest.raises(ValueError, match="measure longer"):
        an.attribute_power(updates[:3], spans)


def test_decode_reasons() -> None:
    assert an.decode_reasons(0x4) == ["sw_power_cap"]
    assert an.decode_reasons(0x1 | 0x40 | 0x1000) == ["gpu_idle", "hw_thermal_slowdown", "0x1000"]
    assert an.reason_shares([0x4, 0x4, 0x0, 0x5]) == {"sw_power_cap": 0.75, "gpu_idle": 0.25}


def test_the_gpt_like_stage_runs_its_1f1b_order_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    import gpu_check_cuda as cu

    cfg = cu.StageConfig(layers=2, hidden=64, heads=4, seq=16, microbatch=2, microbatches=4, warmup=2, tail_repeats=2)
    stage = cu.Stage(cfg, torch.device("cpu"), torch.float32)
    before = [p.detach().clone() for p in stage.params]
    for inst in stage.order:
        stage.run(inst)
    assert stage.outputs == {} and all(p.grad is not None for p in stage.params)
    assert all(x.grad is not None for x in stage.inputs)  # the gradient sent to the stage before
    stage.tail()
    assert any(not torch.equal(a, p) for a, p in zip(before, stage.params))
    stage.zero_grad()
    assert all(p.grad is None for p in stage.params)
    assert cu.stage_summary(stage)["order"] == "F0 F1 B0 F2 B1 F3 B2 B3"


class _HostEvent:
    """Stands in for ``torch.cuda.Event`` on CPU: the 'GPU' is the host, so an event completes when
    it is recorded."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.t: float | None = None

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.t is not None

    def synchronize(self) -> None:
        assert self.t is not None

    def elapsed_time(self, other: _HostEvent) -> float:
        return (other.t - self.t) * 1e3


class _SteadySampler:
    """Stands in for the NVML sampler: a counter that gains 0.5 J every 5 ms (100 W)."""

    def __enter__(self) -> _SteadySampler:
        import time

        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        import time

        self.t1 = time.perf_counter()

    def updates(self) -> list[tuple[float, float]]:
        n = int((self.t1 - self.t0) / 0.005)
        return [(self.t0 + k * 0.005, 0.5 * k) for k in range(n + 1)]


def test_the_cuda_parts_run_end_to_end_with_host_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run of the CUDA parts' logic (steps, followers, anchors, attribution, the table) with
    CPU stand-ins for CUDA events and the sampler: what a GPU run would go through, minus the GPU."""
    torch = pytest.importorskip("torch")
    import gpu_check_cuda as cu

    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    cfg = cu.StageConfig(layers=1, hidden=32, heads=2, seq=8, microbatch=1, microbatches=4, warmup=2, tail_repeats=1)
    stage = cu.Stage(cfg, torch.device("cpu"), torch.float32)
    data: dict[str, Any] = {"mode": "read-only", "errors": {}, "stage": cu.stage_summary(stage)}
    data["timer"], data["run_ahead"] = cu.timer_and_run_ahead(stage, 2)
    data["anchor"] = cu.anchor_bias(stage, 2)
    data["switching"] = cu.switching(stage, 2)
    data["attribution"] = cu.attribution(stage, _SteadySampler, 0.3, 0.2)
    # on the host 'GPU' nothing runs ahead: each instruction ends before the next hook
    assert data["run_ahead"]["instructions"]["max"] == 0
    assert data["timer"]["forward"]["ratio"] > 0 and data["timer"]["host_cost_us_per_begin_end"]["n"] == 16
    assert data["anchor"]["resolve_anchor_late_ms"]["min"] >= 0 and data["anchor"]["steps"] == 2
    sw = data["switching"]
    assert sw["chosen"] == cu.Follow.QUERY.value and sw["boundaries"] == 16
    for how in (cu.Follow.SPIN, cu.Follow.BLOCKING, cu.Follow.QUERY):
        assert sw[how.value]["delay_us"]["n"] == 16 and sw[how.value]["delay_us"]["min"] >= 0
        assert set(sw[how.value]["own_clock_share"]) == {"0ms", "10ms"}
    attr = data["attribution"]
    assert attr["steps"] >= 1 and set(attr["direct"]) == {"forward", "backward"}
    assert attr["direct"]["forward"]["power_w"] == pytest.approx(100.0)
    table = gpu_check.markdown(data)
    for row in ("| event timer vs synchronized reference | forward", "| anchor at resolve() after a sync: late by |",
                "| host run-ahead (no host sync) | 0 instructions", "| follower: event.query every 50 us (chosen) | delay",
                "| forward power: attributed vs direct | direct 100 W; anchor_event"):
        assert row in table, row
    assert "cannot render" not in table and "failed**" not in table
