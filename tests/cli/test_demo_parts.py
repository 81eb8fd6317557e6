"""Framework-neutral demo pieces: the simulated-compute listener and the A/B/A report."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perseus_demo.common import SimulatedCompute, Straggler, format_report, phase_table
from perseus.errors import PerseusError


class _Kernels:
    """The runtime's simulated kernels: remembers the nominal max-clock times it is padded to."""

    def __init__(self, log: list[str]):
        self.log, self.padded = log, []
        # a synchronous simulated GPU without a step tail (the runtime's step end would run one)
        self.device = SimpleNamespace(asynchronous=False, model=SimpleNamespace(step_tail_s=0.0))

    def pad(self, t_max_s: float) -> None:
        self.log.append("pad")
        self.padded.append(t_max_s)


class _Recorder:
    """Records calls; stands in for both the runtime and the simulated GPU."""

    def __init__(self, log: list[str], energy: list[float] | None = None):
        self.log, self.energy = log, energy
        self.phase = SimpleNamespace(value="deployed")
        self.sim_kernels = _Kernels(log)

    def total_energy_j(self) -> float:
        self.energy[0] += 5.0
        return self.energy[0]

    def last_busy_clock_mhz(self) -> int:
        return 1410

    def true_energy_j(self) -> float:
        return self.energy[0] if self.energy else 0.0

    def __getattr__(self, name: str):
        return lambda *args: self.log.append(name)


def test_simulated_compute_pads_the_runtimes_kernel_to_the_nominal_time_and_records_its_clock():
    log: list[str] = []
    runtime = _Recorder(log)
    wrapper = SimulatedCompute(runtime, _Recorder(log, [0.0]), {"forward": 0.01})
    wrapper.on_step_begin()
    wrapper.on_instruction_begin("forward", 0, 0)
    wrapper.on_instruction_end("forward", 0, 0)
    wrapper.on_step_end()
    # the runtime's kernel spans the instruction; it is padded before the runtime ends it
    assert log == ["on_step_begin", "on_instruction_begin", "pad", "on_instruction_end", "on_step_end"]
    (it,) = wrapper.iterations
    # the kernel's max-clock time is at least the nominal one; the clock it ended at is recorded
    assert runtime.sim_kernels.padded == [0.01] and it["instructions"] == [["forward", 0, 0, 1410]]
    assert it["phase"] == "deployed" and it["energy_j"] == 5.0
    # With the runtime stopped (default clocks), the kernels still run; iterations carry the demo's label.
    wrapper.phase_override = "baseline again"
    wrapper.on_step_begin()
    wrapper.on_instruction_begin("backward", 0, 0)
    wrapper.on_instruction_end("backward", 0, 0)
    wrapper.on_step_end()
    assert wrapper.iterations[-1]["phase"] == "baseline again" and runtime.sim_kernels.padded[-1] == 0.0


def test_simulated_compute_needs_the_runtime_on_a_simulated_gpu():
    with pytest.raises(PerseusError, match="simulated GPU"):
        SimulatedCompute(SimpleNamespace(sim_kernels=None), None, {})


def test_phase_table_takes_slowest_rank_time_and_sums_energy_over_ranks():
    results = [
        {"steps": [{"step": 0, "phase": "warmup", "time_s": 1.0, "energy_j": 10.0},
                   {"step": 1, "phase": "deployed", "time_s": 1.0, "energy_j": 8.0}]},
        {"steps": [{"step": 0, "phase": "warmup", "time_s": 1.2, "energy_j": 20.0},
                   {"step": 1, "phase": "deployed", "time_s": 1.1, "energy_j": 16.0}]},
    ]
    table = phase_table(results)
    assert table["warmup"] == {"iterations": 1, "time_s": 1.2, "energy_j": 30.0}
    assert table["deployed"] == {"iterations": 1, "time_s": 1.1, "energy_j": 24.0}
    assert "deployed plan vs warmup (default clocks): 20.0% less energy" in format_report(table)
    results[0]["steps"].append({"step": 2, "phase": "baseline again", "time_s": 1.0, "energy_j": 12.0})
    results[1]["steps"].append({"step": 2, "phase": "baseline again", "time_s": 1.0, "energy_j": 28.0})
    # The re-measured baseline (A/B/A) is the reference when present.
    assert "deployed plan vs baseline again (default clocks): 40.0% less energy" in format_report(phase_table(results))


def test_median_resists_one_disturbed_iteration():
    steps = [{"step": i, "phase": "deployed", "time_s": t, "energy_j": 1.0} for i, t in enumerate([1.0, 1.0, 9.0])]
    assert phase_table([{"steps": steps}])["deployed"]["time_s"] == 1.0


def test_straggler_slows_only_its_replica_inside_the_window_and_labels_every_rank():
    log: list[str] = []
    straggler = Straggler(dp_rank=1, factor=3.0, start=1, stop=2)
    slow_runtime = _Recorder(log)
    slow = SimulatedCompute(slow_runtime, _Recorder(log, [0.0]), {"forward": 0.01})
    fast = SimulatedCompute(_Recorder(log), _Recorder(log, [0.0]), {"forward": 0.01})
    for deployed in range(3):
        straggler.apply([slow], 1, deployed)
        straggler.apply([fast], 0, deployed)
        for c in (slow, fast):
            c.on_step_begin()
            c.on_instruction_begin("forward", 0, 0)
            c.on_instruction_end("forward", 0, 0)
            c.on_step_end()
    assert [it["phase"] for it in slow.iterations] == ["deployed", "deployed (straggler)", "deployed"]
    assert [it["phase"] for it in fast.iterations] == ["deployed", "deployed (straggler)", "deployed"]
    assert [it["slow_factor"] for it in slow.iterations] == [1.0, 3.0, 1.0]
    assert [it["slow_factor"] for it in fast.iterations] == [1.0, 1.0, 1.0]
    assert slow_runtime.sim_kernels.padded[1] == pytest.approx(0.03)  # 3x the nominal kernel time while straggling
    assert slow.iterations[1]["begin_s"] < slow.iterations[2]["begin_s"]


@pytest.mark.parametrize("bad", [{"factor": 0.5}, {"start": 5, "stop": 5}, {"start": -1}])
def test_straggler_rejects_impossible_windows(bad):
    with pytest.raises(PerseusError, match="straggler"):
        Straggler(**bad)


def test_the_demos_freeze_what_setup_made_out_of_full_collections() -> None:
    """A full collection walks every object the imports made (150-300 ms per torch demo rank), and on
    the simulated GPU that time inside an instruction is kernel work: ``run_phases`` freezes what
    exists before training."""
    import gc

    from perseus_demo.common import DemoSettings, run_phases

    compute = SimpleNamespace(iterations=[], phase_override=None, phase_suffix="", slow_factor=1.0)
    handle = SimpleNamespace(summary=lambda: {"slowdown": 1.0}, runtime=SimpleNamespace(stop=lambda: None))

    def step() -> None:
        compute.iterations.append({"phase": "deployed"})

    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        records, _ = run_phases(step, [compute], handle, DemoSettings(deployed_steps=2, rebaseline_steps=1))  # type: ignore[list-item]  # a stand-in with SimulatedCompute's fields
        assert len(records) == 3 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
