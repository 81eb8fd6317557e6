"""The replay preset: a simulated GPU whose time and power per clock are one stage of measured runs.

The physics (tabulated slowdown and power) needs no data; the preset and each instruction's drawn
time need the public artifact's measured A100 runs and skip where they are absent.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from perseus.errors import ProfileError
from perseus.gpu.errors import GPUInvalidArgumentError
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import PRESETS, replay_preset
from perseus.gpu.sim.virtual_clock import VirtualClock
from perseus.measured.replay import load_replay
from perseus.runtime.port.sim_kernels import SimulatedKernels

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measured"))
from artifact import unpack, workload_dir

SCALE = 0.1
TABLE = {"table_clocks_mhz": (1200, 1300, 1410), "table_slowdown": (1.2, 0.98, 1.0), "table_power_w": (200.0, 260.0, 300.0)}


@pytest.fixture(scope="module")
def gpt3_dir(tmp_path_factory):
    return workload_dir(unpack(tmp_path_factory), "gpt3-xl")


def test_a_tabulated_model_interpolates_its_table_whatever_the_activity():
    m = replace(PRESETS["A100-SXM"], **TABLE)
    assert m.slowdown(1300, 0.2) == m.slowdown(1300, 0.9) == 0.98
    assert m.slowdown(1250, 0.8) == pytest.approx(1.09) and m.slowdown(900, 0.8) == 1.2  # flat beyond the table
    assert m.busy_power_w(1355, 0.1) == pytest.approx(280.0)
    assert m.kernel_energy_j(0.01, 1410, activity=0.3) == pytest.approx(3.0)


def test_the_plain_presets_record_nothing_of_the_replay_and_a_table_round_trips_the_state_file(tmp_path):
    assert not any(k.startswith(("table_", "replay_")) for k in PRESETS["A100-SXM"].to_dict())
    m = replace(PRESETS["A100-SXM"], **TABLE, replay_dir="/runs", replay_stage=2)
    SimulatedGPU(0, model=m, state_dir=tmp_path, reset_state=True).close()
    attached = SimulatedGPU(0, state_dir=tmp_path)  # a controller process: the file's model, JSON lists and all
    assert attached.model == m and attached.model.replays and attached.model.table_clocks_mhz == (1200, 1300, 1410)
    again = SimulatedGPU(0, model=m, state_dir=tmp_path)  # restating the same model attaches
    assert again.model == m
    with pytest.raises(GPUInvalidArgumentError, match="equally long"):
        replace(m, table_power_w=(1.0,))


def test_replay_is_the_preset_and_a_bad_directory_is_one_line(tmp_path):
    with pytest.raises(GPUInvalidArgumentError, match="pass it without preset= or model="):
        SimulatedGPU(0, replay=str(tmp_path), preset="A40", state_dir=tmp_path)
    with pytest.raises(GPUInvalidArgumentError, match="a workload directory or"):
        SimulatedGPU(0, replay={"path": str(tmp_path)}, state_dir=tmp_path)
    with pytest.raises(ProfileError) as raised:
        SimulatedGPU(0, replay=str(tmp_path / "runs"), state_dir=tmp_path)
    assert str(raised.value) == f"{tmp_path / 'runs'}: not a directory"


def test_the_preset_offers_the_measured_clocks_with_each_stage_s_power_and_the_fitted_p_blocking(gpt3_dir):
    source = load_replay(gpt3_dir, SCALE)
    for stage in range(4):
        m = replay_preset({"dir": str(gpt3_dir), "time_scale": SCALE}, stage)
        assert m.supported_sm_clocks()[::-1] == list(source.clocks_mhz) == list(range(1035, 1411, 15))
        assert m.p_blocking_w == source.p_blocking_w and m.replay_stage == stage and m.replay_time_scale == SCALE
        assert m.busy_power_w(1200) == pytest.approx(source.power_w(stage, 1200), rel=1e-5)
        assert m.slowdown(1035, 0.8) == pytest.approx(source.slowdown(stage, 1035), rel=1e-5)
    with pytest.raises(GPUInvalidArgumentError, match="simulated GPU 4 has no stage to replay: .* measured 4 stages"):
        replay_preset(str(gpt3_dir), 4)


@pytest.mark.parametrize("clock", [1410, 1200, 1035])
def test_each_instruction_takes_a_drawn_measured_time_at_the_stage_s_power(gpt3_dir, tmp_path, clock):
    vc = VirtualClock()
    gpu = SimulatedGPU(2, replay={"dir": str(gpt3_dir), "time_scale": SCALE}, state_dir=tmp_path, reset_state=True,
                       energy_update_period_s=0, clock=vc.now, sleep=vc.sleep)
    kernels = SimulatedKernels(gpu)
    gpu.set_locked_sm_clock(clock)
    source, rng = load_replay(gpt3_dir, SCALE), np.random.default_rng([gpu.seed, 2])
    for kind in ("forward", "backward", "forward"):
        before = gpu.true_energy_j()
        kernels.begin()
        kernels.end(kind)
        took = gpu.last_busy_interval()[1]
        assert took == pytest.approx(source.draw_s(2, kind, clock, rng), rel=1e-9)
        assert abs(took / source.time_s(2, kind, clock) - 1) < 0.02  # a measured instance: within the spread
        assert (gpu.true_energy_j() - before) / took == pytest.approx(source.power_w(2, clock), rel=1e-5)
    kernels.begin()
    kernels.pad(0.003)
    kernels.end("backward_weight")  # no measured time: the pad (or the CPU work) as on any simulated GPU
    assert gpu.last_busy_interval()[1] == pytest.approx(0.003 * gpu.model.slowdown(clock, 0.8))


def test_the_asynchronous_stream_runs_the_drawn_times_too(gpt3_dir, tmp_path):
    gpu = SimulatedGPU(1, replay={"dir": str(gpt3_dir), "time_scale": SCALE}, state_dir=tmp_path, reset_state=True,
                       energy_update_period_s=0, stream_depth=2)
    try:
        kernels = SimulatedKernels(gpu)
        gpu.set_locked_sm_clock(1200)
        for kind in ("forward", "backward"):
            kernels.begin()
            kernels.end(kind)
        gpu.stream.synchronize()
        source = load_replay(gpt3_dir, SCALE)
        took = [k.end_s - k.start_s for k in gpu.stream.kernels()]
        assert took == pytest.approx([source.time_s(1, kind, 1200) for kind in ("forward", "backward")], rel=0.03)
    finally:
        gpu.close()
