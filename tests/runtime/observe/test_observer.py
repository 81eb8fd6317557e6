"""``Observer.record`` reads a step off one ``RunView``; ``Observer.publish`` completes the record
from one ``StepEnd`` value: the point's figures on a deployed step only, the clock and straggler
ratio as they hold at step end, instructions per clock for sinks, running totals."""

from __future__ import annotations

import json
from types import SimpleNamespace

from perseus.planner.stage_plan import StagePoint
from perseus.runtime.config import PerseusConfig
from perseus.runtime.observe.metrics import StepMetrics
from perseus.runtime.observe.observer import Observer, StepEnd
from perseus.runtime.clocks.targeting import Targeting
from perseus.runtime.phases import Phase
from perseus.runtime.port.gpu_timeline import StepNumbers


class Sink:
    def __init__(self) -> None:
        self.rows: list[StepMetrics] = []

    def write(self, step: int, metrics: StepMetrics) -> None:
        self.rows.append(metrics)

    def close(self) -> None:
        pass


def _end(point: StagePoint | None) -> StepEnd:
    return StepEnd(clock_mhz=1200, default_mhz=1410, follower=None, point=point, slowdown=1.1, straggler_ratio=1.05,
                   job_energy_j=42.0, stage_instructions=4)


def test_publish_completes_the_record_from_the_step_end():
    observer = Observer(0, PerseusConfig.from_dict({"cache_dir": None, "log_every_steps": 0}), True)
    sink = Sink()
    observer.add_sink(sink)
    point = StagePoint(time_s=1.1, energy_j=90.0, row=0)
    try:
        warm = observer.publish(StepMetrics(step=0, rank=0, phase=Phase.WARMUP, time_s=1.0, energy_j=100.0),
                                _end(point))
        deployed = observer.publish(StepMetrics(step=1, rank=0, phase=Phase.DEPLOYED, time_s=1.1, energy_j=90.0),
                                    _end(point))
    finally:
        observer.close()
    assert warm.point_slowdown is None and warm.point_energy_j is None  # not running the point
    assert (deployed.point_slowdown, deployed.point_energy_j) == (1.1, 90.0)
    assert deployed.clock_mhz == 1200 and deployed.straggler_ratio == 1.05 and deployed.job_energy_j == 42.0
    assert warm.instructions == {1410: 4} and deployed.energy_j_total == 190.0
    assert sink.rows == [warm, deployed] and observer.reporter.records == []  # only ``record`` keeps


def test_record_reads_the_step_off_the_run_view(tmp_path):
    """``record`` takes the run as one value: the step's numbers (GPU time where the GPU ran
    behind the host), its phase, the sweep's clock while profiling; written to the file at once."""
    path = tmp_path / "m.jsonl"
    observer = Observer(0, PerseusConfig.from_dict({"cache_dir": None, "log_every_steps": 0,
                                                    "metrics_file": str(path)}), True)
    numbers = StepNumbers(time_s=1.2, energy_j=300.0, span_s=1.1, non_instruction_s=0.1,
                          non_instruction_energy_j=20.0, gpu_time=True, host_s=1.25)
    run = SimpleNamespace(step=7, measured=numbers, phases=SimpleNamespace(phase=Phase.PROFILING),
                          supply=SimpleNamespace(profiling=SimpleNamespace(sweep=SimpleNamespace(current_mhz=1305))),
                          targeting=Targeting(), loop=None)
    try:
        record = observer.record(run)
        host_only = observer.record(SimpleNamespace(**{**vars(run), "step": 8, "measured": StepNumbers(1.0, 2.0, 0.9),
                                                       "phases": SimpleNamespace(phase=Phase.WARMUP)}))
    finally:
        observer.close()
    assert (record.step, record.phase, record.time_s, record.energy_j, record.freq_mhz) == (
        7, Phase.PROFILING, 1.2, 300.0, 1305)
    assert (record.gpu_step_s, record.instruction_span_s, record.non_instruction_gpu_s,
            record.non_instruction_energy_j, record.host_time_s) == (1.2, 1.1, 0.1, 20.0, 1.25)
    assert host_only.freq_mhz is None and host_only.gpu_step_s is None and host_only.host_time_s is None
    assert observer.reporter.records == [record, host_only]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["freq_mhz"], r.get("gpu_step_s")) for r in rows] == [(7, 1305, 1.2), (8, None, None)]
