"""The simulator's modules on their own: the integrator as pure arithmetic on a ``SimState``, the
parameters matched against the state file, and the import surface the rest of the code relies on."""

from __future__ import annotations

import subprocess
import sys

import pytest

import perseus.gpu
from perseus.gpu.errors import GPUError, GPUInvalidArgumentError
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.sim.device import SimulatedGPU, VirtualClock
from perseus.gpu.sim.dvfs import get_preset
from perseus.gpu.sim.integrator import StateIntegrator
from perseus.gpu.sim.params import check_params, explicit_params, open_state_file
from perseus.gpu.sim.state import SimState

A100 = get_preset("A100-SXM")


def integrator(period: float = 0.1, latency: float = 0.0) -> StateIntegrator:
    return StateIntegrator(A100, energy_update_period_s=period, counter_phase_s=0.0, noise=0.0, seed=0,
                           switch_latency_s=latency)


def idle_state(t: float = 0.0) -> SimState:
    return SimState(power_limit_w=A100.tdp_w, t_ref=t, power_w=A100.p_blocking_w)


def test_the_counter_advances_only_at_update_boundaries():
    phys, st = integrator(period=0.1), idle_state()
    assert phys.counter_reading(st, 0.05) == (0.0, 0.0)
    value, at = phys.counter_reading(st, 0.25)
    assert at == pytest.approx(0.2) and value == pytest.approx(A100.p_blocking_w * 0.2)
    assert phys.true_energy(st, 0.25) == pytest.approx(A100.p_blocking_w * 0.25)
    continuous = integrator(period=0.0)
    assert continuous.counter_reading(st, 0.25) == (phys.true_energy(st, 0.25), 0.25)


def test_a_clock_change_lands_after_the_switch_latency_also_mid_kernel():
    phys, st = integrator(latency=0.01), idle_state()
    st.busy, st.activity, st.compute_fraction = 1, 0.5, 1.0
    phys.refresh_power(st)
    phys.request_clock(st, 1, A100.sm_max_mhz // 2, now=0.0)
    assert st.pending and not st.locked
    # 0.01 s at the max clock, then the rest at half the clock: twice as slow.
    assert phys.kernel_end(st, 0.0, 0.03) == pytest.approx(0.01 + 0.02 * phys.model.slowdown(
        phys.model.nearest_clock(A100.sm_max_mhz // 2), 1.0))
    phys.settle(st, 0.02)
    assert not st.pending and st.locked and st.applied_at == 0.01


def test_parameters_are_checked_and_an_attached_gpu_keeps_its_own(tmp_path):
    with pytest.raises(GPUInvalidArgumentError, match="either preset= or model="):
        check_params(preset="A100-SXM", model=A100, energy_update_period_s=None, noise=None, switch_latency_s=None)
    first = explicit_params(preset="A100-SXM", model=None, energy_update_period_s=0.05, noise=None, seed=None,
                            switch_latency_s=None)
    open_state_file(0, tmp_path / "gpu0.state", first, reset=True, now=0.0).close()
    attached = open_state_file(0, tmp_path / "gpu0.state", {}, reset=False, now=1.0)
    assert attached.params["energy_update_period_s"] == 0.05
    attached.close()
    with pytest.raises(GPUError, match="energy_update_period_s"):
        open_state_file(0, tmp_path / "gpu0.state", {"energy_update_period_s": 0.1}, reset=False, now=1.0)


def test_the_device_module_and_the_layer_export_what_callers_import(tmp_path):
    vc = VirtualClock()
    g = SimulatedGPU(0, state_dir=tmp_path, clock=vc.now, sleep=vc.sleep, reset_state=True)
    assert g.run_for(0.01) == pytest.approx(0.01) and vc.now() == pytest.approx(1000.01)
    g.close()
    assert perseus.gpu.NVMLGPU is NVMLGPU and perseus.gpu.VirtualClock is VirtualClock


def test_importing_the_layer_or_the_nvml_backend_loads_neither_torch_nor_pynvml():
    code = ("import sys, perseus.gpu, perseus.gpu.nvml.device; "
            "print(sorted(m for m in ('torch', 'pynvml') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
