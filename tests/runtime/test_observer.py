"""``Observer.publish`` completes a step's record from one ``StepEnd`` value: the point's figures
on a deployed step only, the clock and straggler ratio as they hold at step end, instructions per
clock for sinks, running totals."""

from __future__ import annotations

from perseus.planner.stage_plan import StagePoint
from perseus.runtime.config import PerseusConfig
from perseus.runtime.observe.metrics import StepMetrics
from perseus.runtime.observe.observer import Observer, StepEnd
from perseus.runtime.phases import Phase


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
