"""Perseus's per-step metrics through DeepSpeed's monitor (TensorBoard, wandb, CSV, Comet).

``engine.monitor`` is DeepSpeed's ``MonitorMaster``: whatever the DeepSpeed config enables
(``"tensorboard"``, ``"wandb"``, ``"csv_monitor"``, ``"comet"``) receives
``write_events([(name, value, x), ...])``, written on global rank 0 only. ``MonitorSink`` hands
it the ``perseus/*`` scalars (perseus/runtime/observe/metrics.py) at every step end with DeepSpeed's own
x-axis, ``engine.global_samples`` (its ``Train/Samples/train_loss`` uses the same), so Perseus's
curves line up with the loss. Per-GPU numbers are therefore global rank 0's; the whole job's are
there too: ``perseus/job_energy_j`` at the steps of a periodic job check, and every stage's energy
with the job's saving against its default-clock probes (``perseus/stage<S>_energy_j``,
``perseus/job_saving_ratio`` and its interval) at the steps where a probe window ended. Every rank
learns those from the guard's rows (perseus/runtime/observe/job_saving.py), so rank 0's monitor
shows every stage, not the first one alone.
"""

from __future__ import annotations

import weakref
from typing import Any

from perseus.runtime import StepMetrics


def monitor_enabled(engine: Any) -> bool:
    monitor = getattr(engine, "monitor", None)
    return monitor is not None and bool(getattr(monitor, "enabled", False))


class MonitorSink:
    """Per-step metrics to ``engine.monitor``; holds the engine weakly (it owns the runtime)."""

    def __init__(self, engine: Any) -> None:
        self._engine = weakref.ref(engine)

    def write(self, step: int, metrics: StepMetrics) -> None:
        engine = self._engine()
        if engine is None or not monitor_enabled(engine) or getattr(engine, "global_rank", 0) != 0:
            return  # MonitorMaster writes on global rank 0 only: nothing to build elsewhere
        x = int(getattr(engine, "global_samples", step))
        engine.monitor.write_events([(name, value, x) for name, value in metrics.scalars().items()])

    def close(self) -> None:
        pass
