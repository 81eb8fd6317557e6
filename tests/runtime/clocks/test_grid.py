"""The grid's targets in one process: what rank 0 decides from working, failing and changing
sources, how the targets compose with a straggler and the guard, and the per-step metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_targeting import small_plan

from perseus.errors import PerseusError
from perseus.runtime.guard.closed_loop import guard_target_ratio
from perseus.runtime.plane.collective import Collective
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.clocks.grid import GridControl
from perseus.runtime.observe.metrics import SCALARS, StepMetrics
from perseus.runtime.observe.observer import Observer
from perseus.runtime.phases import Phase
from perseus.runtime.port.gpu_timeline import StepNumbers
from perseus.runtime.observe.prometheus import SNAPSHOT_KEYS
from perseus.runtime.clocks.targeting import CarbonTarget, PowerCapTarget, Targeting

JOB = PipelineJob(num_stages=2, num_microbatches=2, stage=0, world_size=8)  # 4 pipelines: job power = 4 x


def control(tmp_path: Path, clock: list[float], **settings) -> GridControl:
    config = PerseusConfig.from_dict({"cache_dir": None, "grid_every_steps": 2, **settings})
    grid = GridControl(config, Collective(), JOB, clock=lambda: clock[0])
    grid.open()
    return grid


def write_trace(path: Path, values: list[float]) -> Path:
    rows = [f"2022-06-01T{h:02d}:00:00Z,{v}" for h, v in enumerate(values)]
    path.write_text("timestamp,avg_CI\n" + "\n".join(rows) + "\n")
    return path


def test_power_cap_from_a_file_is_met_from_the_next_decision(tmp_path):
    plan = small_plan()  # powers: 10 W, 7.27 W, 5.6 W, 4.53 W per pipeline; x4 for the job
    cap_file = tmp_path / "cap"
    cap_file.write_text("100")
    clock = [0.0]
    grid, targeting = control(tmp_path, clock, power_cap_source=str(cap_file)), Targeting()
    assert grid.end_step(targeting, plan).target.time_s == 1.0  # 40 W under 100 W: the fastest
    targeting.deploy(plan)
    cap_file.write_text("25")  # demand response: shed load now
    assert grid.end_step(targeting, plan) is None  # between decisions nothing is read
    decision = grid.end_step(targeting, plan)
    assert isinstance(decision.target, PowerCapTarget) and decision.target.time_s == 1.25  # 22.4 W <= 25 W
    assert targeting.due and targeting.retarget(plan).time_s == 1.25
    # a cap no point meets: the least-power point, said once
    cap_file.write_text("5")
    grid.end_step(targeting, plan)
    decision = grid.end_step(targeting, plan)
    assert decision.target.time_s == 1.5 and "below the least-power point" in decision.error
    # the operator's file disappears: the last cap stays in force (a broken sensor never lifts a cap)
    cap_file.unlink()
    grid.end_step(targeting, plan)
    decision = grid.end_step(targeting, plan)
    assert decision.target.power_cap_w == 5.0 and "cannot read it" in decision.error
    grid.close()


def test_carbon_source_that_fails_runs_the_no_slowdown_point(tmp_path):
    plan = small_plan()
    clock = [0.0]

    def broken():
        raise TimeoutError("grid API")

    config = PerseusConfig.from_dict({"cache_dir": None, "grid_every_steps": 1})
    grid = GridControl(config, Collective(), JOB, clock=lambda: clock[0])
    assert not grid.enabled
    grid.use_sources(carbon=broken)  # a Python callable
    targeting = Targeting()
    decision = grid.end_step(targeting, plan)
    assert decision.target is None and "raised TimeoutError" in decision.error
    assert targeting.choose(plan) is plan.default_point()  # training goes on, at no slowdown


def test_a_bad_trace_is_one_line_before_training(tmp_path):
    bad = tmp_path / "ci.csv"
    bad.write_text("timestamp,solar\n2022-01-01T00:00Z,3\n")
    with pytest.raises(PerseusError, match="no value column"):
        control(tmp_path, [0.0], carbon_source=str(bad))


def test_carbon_trace_replayed_moves_points_with_the_intensity(tmp_path):
    plan = small_plan()
    values = ([100] * 4 + [500] * 4) * 3
    trace = write_trace(tmp_path / "ci.csv", values)
    clock = [1000.0]
    grid = control(tmp_path, clock, carbon_source=str(trace), carbon_replay_speed=3600.0, carbon_time_budget=0.2,
                   carbon_horizon_windows=4, grid_every_steps=1)
    targeting = Targeting()
    chosen = []
    for hour in range(24):
        clock[0] = 1000.0 + hour + 0.5  # one trace hour per second of the run
        decision = grid.end_step(targeting, plan)
        chosen.append((decision.target.intensity, decision.target.time_s))
    assert [ci for ci, _ in chosen] == values  # the metrics' intensity: the trace's hour
    # each hour's point follows the forecast from the hours before (persistence this early), so
    # compare the hours whose intensity the forecast knew: slower where the grid is dirty
    settled = [h for h in range(8, 24) if values[h - 1] == values[h]]
    dirty = [chosen[h][1] for h in settled if values[h] == 500]
    clean = [chosen[h][1] for h in settled if values[h] == 100]
    assert min(dirty) >= max(clean) and max(dirty) > min(clean)
    grid.close()


def test_probes_under_a_carbon_target_with_a_cap_run_the_fastest_point_under_the_cap(tmp_path):
    """A carbon target picks a slow point on purpose; the guard's probes must run what the capped
    job would run without it (the fastest point under the cap, never above it), not the carbon
    point itself, which would compare the plan with itself. Without a cap: default clocks."""
    from perseus.runtime.guard.closed_loop import ClosedLoop

    plan = small_plan()  # job powers 40, 29.1, 22.4, 18.1 W at 1.0, 1.1, 1.25, 1.5 s
    loop = ClosedLoop(PerseusConfig(probe_every_steps=8), Collective())
    for cap, probe_s in ((35.0, 1.1), (25.0, 1.25), (None, None)):
        config = PerseusConfig.from_dict({"cache_dir": None, "grid_every_steps": 1, "carbon_time_budget": 0.5,
                                          **({} if cap is None else {"power_cap_w": cap})})
        grid = GridControl(config, Collective(), JOB, clock=lambda: 1000.0)
        grid.use_sources(carbon=lambda: 500.0)
        targeting = Targeting()
        target = grid.end_step(targeting, plan).target
        assert isinstance(target, CarbonTarget) and target.time_s == 1.5  # the carbon point, under any cap here
        assert targeting.deploy(plan)[0].time_s == 1.5
        reference = loop.reference_point(targeting, plan)
        if probe_s is None:
            assert reference is None  # default clocks
            assert guard_target_ratio(targeting, plan) == pytest.approx(1.5)
        else:
            assert reference is not None and reference.time_s == probe_s
            assert JOB.world_size / JOB.num_stages * plan.points[[p.time_s for p in plan.points].index(probe_s)].energy_j \
                / probe_s <= cap  # the probe's planned job power is under the cap
            # the plan is held to the carbon point's time in units of the probe's
            assert guard_target_ratio(targeting, plan, reference) == pytest.approx(1.5 / probe_s)
        grid.close()
    # a new cap alone (the same carbon point) moves the probes: the A/B and the test start afresh
    targeting = Targeting()
    targeting.set_grid(CarbonTarget(1.5, 500.0, 18.1, 35.0, 1.1))
    targeting.retarget(plan)
    targeting.set_grid(CarbonTarget(1.5, 500.0, 18.1, 25.0, 1.25))
    assert targeting.due


def test_set_grid_is_due_only_when_the_point_changes():
    targeting = Targeting()
    targeting.set_grid(CarbonTarget(1.1, 300.0, 40.0))
    assert targeting.due
    targeting.due = False
    targeting.set_grid(CarbonTarget(1.1, 320.0, 40.0))  # a new intensity, the same point
    assert not targeting.due and targeting.grid.intensity == 320.0
    targeting.set_grid(None)
    assert targeting.due


def test_grid_target_behind_a_straggler_is_paced_and_the_guard_holds_its_time():
    plan = small_plan()
    targeting = Targeting()
    targeting.set_grid(CarbonTarget(1.1, 300.0, 40.0))
    assert targeting.choose(plan).time_s == 1.1
    assert guard_target_ratio(targeting, plan) == pytest.approx(1.1)
    for _ in range(3):  # a straggler 1.4x the default point's 1.0 s
        targeting.observe_slowdown(1.4)
    assert targeting.straggler_ratio > 1.1
    paced = plan.paced_lookup(plan.default_point().time_s * targeting.straggler_ratio)
    assert targeting.choose(plan) is paced  # slower than the grid's point: the paced point
    assert guard_target_ratio(targeting, plan) == pytest.approx(targeting.straggler_ratio)


def test_step_metrics_carry_carbon_and_power(tmp_path):
    config = PerseusConfig.from_dict({"cache_dir": None})
    observer = Observer(0, config, True)
    targeting = Targeting()
    targeting.set_grid(PowerCapTarget(1.25, 25.0, 22.4, intensity=400.0))

    class Loop:
        probing = False
        clocks = "plan"

        class role:
            counted = True

        def step_figure(self, *a):
            return None

        def figure(self):
            return None

    # the observer's view of a deployed run (RunView): 1 kWh/1000 per step at 400 gCO2/kWh
    run = SimpleNamespace(step=0, measured=StepNumbers(1.0, 3.6e6 / 1000, 1.0), phases=SimpleNamespace(
        phase=Phase.DEPLOYED), targeting=targeting, loop=Loop())
    first = observer.record(run)
    run.step = 1
    second = observer.record(run)
    assert first.carbon_g == pytest.approx(0.4) and second.carbon_g_total == pytest.approx(0.8)
    scalars = second.scalars()
    for name in ("carbon_intensity", "carbon_g", "carbon_g_total", "job_power_w", "power_cap_w"):
        assert f"perseus/{name}" in scalars and name in SCALARS
    assert scalars["perseus/power_cap_w"] == 25.0 and second.file_row()["job_power_w"] == 22.4
    assert set(second.prometheus()) <= SNAPSHOT_KEYS
    # no grid target: no carbon fields anywhere
    plain = StepMetrics(step=0, rank=0, phase=Phase.DEPLOYED, time_s=1.0, energy_j=1.0)
    assert "carbon_g" not in plain.file_row() and "perseus/carbon_g" not in plain.scalars()
    observer.close()


def test_prometheus_exports_the_grid_gauges():
    pytest.importorskip("prometheus_client")
    from perseus.runtime.observe.prometheus import PrometheusExporter

    with PrometheusExporter(port=0) as exporter:
        exporter.update({"carbon_intensity": 250.0, "carbon_total_g": 12.5, "job_power_w": 800.0, "power_cap_w": 900.0})
        import urllib.request

        text = urllib.request.urlopen(exporter.url, timeout=10).read().decode()
    assert "perseus_carbon_intensity_grams_per_kwh 250.0" in text and "perseus_power_cap_watts 900.0" in text
    assert "perseus_carbon_grams 12.5" in text and "perseus_job_power_watts 800.0" in text


def test_a_zeus_provider_drives_the_carbon_target():
    class ElectricityMapsClient:  # zeus.monitor.carbon's interface, by its one method
        def __init__(self):
            self.values = iter([120.0, 480.0])

        def get_current_carbon_intensity(self) -> float:
            return next(self.values)

    plan = small_plan()
    clock = [0.0]
    config = PerseusConfig.from_dict({"cache_dir": None, "grid_every_steps": 1, "carbon_time_budget": 0.2})
    grid = GridControl(config, Collective(), JOB, clock=lambda: clock[0])
    grid.use_sources(carbon=ElectricityMapsClient())
    targeting = Targeting()
    first = grid.end_step(targeting, plan)
    assert isinstance(first.target, CarbonTarget) and first.target.intensity == 120.0 and first.error is None
    clock[0] = 3600.0
    assert grid.end_step(targeting, plan).target.intensity == 480.0
    grid.close()
