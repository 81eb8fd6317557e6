"""Perseus metrics through DeepSpeed's monitor: the DeepSpeed config's csv_monitor and tensorboard get them.

A real ``PipelineEngine`` in this process (one rank, gloo, CPU) running the real runtime on a
simulated GPU with a given frontier (warm-up, then the plan deployed); the CSV files and
TensorBoard event files DeepSpeed's monitors write are read back and compared with the runtime's
own records. The distributed demo run with ``csv_monitor`` is checked in test_deepspeed_demo.py,
on the demo's own 2-stage launch.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

from perseus.frontier import Frontier, FrontierPoint
from perseus.schedules import build_schedule
from perseus_deepspeed import get_handle, initialize
from deepspeed_monitor_files import read_csv
from perseus_demo.tiny_pipe import TinyPipeShape, build_pipeline, client_optimizer, data_iterator, deepspeed_config
from perseus.frontier import save_frontier

SHAPE = TinyPipeShape(hidden_size=8, layers_per_stage=1, micro_batch_size=2)
MICROBATCHES = 2
PLAN = [1410, 900, 1200, 900]  # forward 0, backward 0, forward 1, backward 1


def test_monitor_csv_and_tensorboard_get_the_runtimes_records(dist_world, tmp_path, monkeypatch):
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    save_frontier(Frontier(build_schedule("1f1b", 1, MICROBATCHES), 80.0, 1.0, 2.0,
             [FrontierPoint(1.0, 1.5, np.array(PLAN))]), tmp_path / "f.json")
    section = {"gpu": "sim", "sim_gpu": {"energy_update_period_s": 0}, "warmup_steps": 2, "cache_dir": None,
               "log_every_steps": 0, "frontier_path": str(tmp_path / "f.json"), "straggler_period_steps": 2,
               "probe_every_steps": 0}  # every deployed step runs the plan (no guard probe among the three)
    config = deepspeed_config(MICROBATCHES, SHAPE, section)
    config["csv_monitor"] = {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "job"}
    config["tensorboard"] = {"enabled": True, "output_path": str(tmp_path / "tb"), "job_name": "job"}
    model = build_pipeline(1, SHAPE)
    engine, *_ = initialize(model=model, optimizer=client_optimizer(model), config=config)
    handle = get_handle(engine)
    data = data_iterator(SHAPE)
    for _ in range(5):
        engine.train_batch(data)
    records = list(handle.runtime.reporter.records)
    baseline = handle.runtime.reporter.baseline_energy_j
    engine.destroy()
    assert [r.phase.value for r in records] == ["warmup", "warmup", "deployed", "deployed", "deployed"]
    samples = [SHAPE.micro_batch_size * MICROBATCHES * (i + 1) for i in range(5)]  # DeepSpeed's x: global_samples
    folder = tmp_path / "csv" / "job"
    assert read_csv(folder, "perseus/energy_j") == [(s, pytest.approx(r.energy_j, rel=1e-12))
                                                    for s, r in zip(samples, records)]
    assert read_csv(folder, "perseus/power_w") == [(s, pytest.approx(r.energy_j / r.time_s, rel=1e-12))
                                                   for s, r in zip(samples, records)]
    assert [v for _, v in read_csv(folder, "perseus/phase")] == [0, 0, 3, 3, 3]
    saved = np.cumsum([baseline - r.energy_j for r in records[2:]])
    assert [v for _, v in read_csv(folder, "perseus/saving_j_total")] == pytest.approx([0, 0, *saved], rel=1e-9)
    assert read_csv(folder, "perseus/point_slowdown") == [(s, 1.0) for s in samples[2:]]
    assert [v for _, v in read_csv(folder, "perseus/instructions_at_900mhz")] == [2, 2, 2]
    assert read_csv(folder, "perseus/job_energy_j") == [
        (samples[3], pytest.approx((records[2].energy_j + records[3].energy_j) / 2, rel=1e-12))]
    assert (folder / "Train_Samples_train_loss.csv").exists()  # DeepSpeed's own events, same folder and x-axis

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb" / "job"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("perseus/energy_j")] == [
        (s, pytest.approx(r.energy_j, rel=1e-6)) for s, r in zip(samples, records)]


def test_without_a_monitor_no_sink_is_added(dist_world, tmp_path, monkeypatch):
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    section = {"gpu": "sim", "mode": "measure-only", "cache_dir": None, "log_every_steps": 0}
    model = build_pipeline(1, SHAPE)
    engine, *_ = initialize(model=model, optimizer=client_optimizer(model),
                            config=deepspeed_config(MICROBATCHES, SHAPE, section))
    try:
        assert get_handle(engine).runtime.observe.sinks == []
    finally:
        engine.destroy()


def test_the_monitor_gets_the_job_saving_and_every_stage_at_each_probe_window(dist_world, tmp_path, monkeypatch):
    """With the guard's default-clock probes on, DeepSpeed's monitor (rank 0's) gets the job's
    saving against them and every stage's energy at the steps where a probe window ended."""
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    save_frontier(Frontier(build_schedule("1f1b", 1, MICROBATCHES), 80.0, 1.0, 2.0,
                           [FrontierPoint(1.0, 1.5, np.array(PLAN))]), tmp_path / "f.json")
    section = {"gpu": "sim", "sim_gpu": {"energy_update_period_s": 0}, "warmup_steps": 2, "cache_dir": None,
               "log_every_steps": 0, "frontier_path": str(tmp_path / "f.json"), "probe_every_steps": 4}
    config = deepspeed_config(MICROBATCHES, SHAPE, section)
    config["csv_monitor"] = {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "job"}
    model = build_pipeline(1, SHAPE)
    engine, *_ = initialize(model=model, optimizer=client_optimizer(model), config=config)
    handle = get_handle(engine)
    data = data_iterator(SHAPE)
    for _ in range(14):
        engine.train_batch(data)
    windows = [r.step for r in handle.runtime.reporter.records if r.job_saving is not None]
    figure = handle.runtime.observe.job_saving.figure
    engine.destroy()
    assert figure is not None and len(windows) == figure.windows >= 2
    folder = tmp_path / "csv" / "job"
    samples = [SHAPE.micro_batch_size * MICROBATCHES * (s + 1) for s in windows]  # DeepSpeed's x: global_samples
    assert [s for s, _ in read_csv(folder, "perseus/job_saving_ratio")] == samples
    assert read_csv(folder, "perseus/job_saving_ratio")[-1][1] == pytest.approx(figure.saving, rel=1e-9)
    assert read_csv(folder, "perseus/job_saving_high_ratio")[-1][1] == pytest.approx(figure.saving_high, rel=1e-9)
    assert read_csv(folder, "perseus/stage0_energy_j")[-1][1] == pytest.approx(figure.stages[0].energy_j, rel=1e-9)
    assert read_csv(folder, "perseus/stage0_saving_ratio")[-1][1] == pytest.approx(figure.stages[0].saving, rel=1e-9)
