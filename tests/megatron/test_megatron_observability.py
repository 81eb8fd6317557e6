"""Perseus metrics in Megatron-LM's views: its TensorBoard/wandb writers and its iteration log line.

Real megatron-core training steps in this process (one rank, gloo, CPU) through ``enable()``; a
real ``torch.utils.tensorboard.SummaryWriter`` registered where Megatron-LM keeps its writer
(``megatron.training.global_vars``, absent with megatron-core alone, so a stand-in module holds
it); the event files are read back with TensorBoard's ``EventAccumulator``. The real Megatron-LM
``pretrain_gpt.py`` with ``--tensorboard-dir`` is in test_megatron_lm_pretrain_gpt.py (it shares
the launch of the 1F1B run there).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("tensorboard")

from torch.utils.tensorboard import SummaryWriter

from perseus.frontier import Frontier, FrontierPoint
from perseus.runtime.observe.metrics import StepMetrics
from perseus.schedules import build_schedule
from perseus_demo.megatron_cpu import cpu_execution
from perseus_megatron.integration import enable
from perseus_megatron.observability import IterationLogText, MegatronWritersSink, add_to_iteration_log
from perseus.frontier import save_frontier
from megatron_fixtures import trainer, no_leftover_hooks  # noqa: F401 - pytest fixtures, found by their names
from tensorboard_events import read_scalars

MICROBATCHES = 3
PLAN = [1410, 1200, 1200, 1005, 1410, 1005]  # one clock per instruction of the one-stage 1F1B order


def sim_gpu(tmp_path: Path) -> dict:
    # energy integrated continuously: a short CPU step still has energy (no coarse counter updates)
    return {"state_dir": str(tmp_path / "sim"), "reset_state": True, "energy_update_period_s": 0}


class Wandb:
    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []

    def log(self, data: dict, step: int) -> None:
        self.logged.append((dict(data), step))


def test_megatron_writers_get_the_runtimes_records_at_megatrons_iteration(trainer, tmp_path, monkeypatch):
    save_frontier(Frontier(build_schedule("1f1b", 1, MICROBATCHES), 80.0, 1.0, 2.0,
             [FrontierPoint(1.0, 3.0, np.array(PLAN))]), tmp_path / "f.json")
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    wandb = Wandb()
    args = types.SimpleNamespace(curr_iteration=0)
    global_vars = types.ModuleType("megatron.training.global_vars")  # what megatron.training keeps
    global_vars._GLOBAL_ARGS = args
    global_vars.get_tensorboard_writer = lambda: writer
    global_vars.get_wandb_writer = lambda: wandb
    monkeypatch.setitem(sys.modules, "megatron.training.global_vars", global_vars)
    handle = enable(gpu="sim", device_index=0, sim_gpu=sim_gpu(tmp_path),
                    cache_dir=None, warmup_steps=2, frontier_path=str(tmp_path / "f.json"), log_every_steps=0)
    first = 100  # a resumed run: Megatron's iterations, not the runtime's steps, are the x-axis
    try:
        with cpu_execution():
            for i in range(5):
                args.curr_iteration = first + i  # train() sets it before each train_step
                trainer.step(MICROBATCHES)
        records = list(handle.runtime.reporter.records)
        baseline = handle.runtime.reporter.baseline_energy_j
    finally:
        handle.close()
    writer.close()
    assert [r.phase.value for r in records] == ["warmup", "warmup", "deployed", "deployed", "deployed"]
    scalars = read_scalars(tmp_path / "tb")
    iterations = [first + 1 + i for i in range(5)]
    assert scalars["perseus/energy_j"] == [(it, pytest.approx(r.energy_j, rel=1e-6)) for it, r in zip(iterations, records)]
    assert scalars["perseus/power_w"] == [(it, pytest.approx(r.energy_j / r.time_s, rel=1e-6))
                                          for it, r in zip(iterations, records)]
    assert scalars["perseus/time_s"] == [(it, pytest.approx(r.time_s, rel=1e-6)) for it, r in zip(iterations, records)]
    assert [v for _, v in scalars["perseus/phase"]] == [0, 0, 3, 3, 3]
    saved = np.cumsum([baseline - r.energy_j for r in records[2:]])
    assert [v for _, v in scalars["perseus/saving_j_total"]] == pytest.approx([0, 0, *saved], rel=1e-5, abs=1e-6)
    assert [s for s, _ in scalars["perseus/point_energy_j"]] == iterations[2:]  # deployed steps only
    assert [v for _, v in scalars["perseus/point_energy_j"]] == [3.0] * 3
    assert [v for _, v in scalars["perseus/instructions_at_1005mhz"]] == [2, 2, 2]
    assert [v for _, v in scalars["perseus/instructions_at_1410mhz"]] == [6, 6, 2, 2, 2]
    # wandb: one log call per iteration with the same names and values
    assert [step for _, step in wandb.logged] == iterations
    assert wandb.logged[-1][0]["perseus/energy_j"] == records[-1].energy_j
    assert set(wandb.logged[-1][0]) == set(scalars)


def test_without_megatron_training_the_writers_sink_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "megatron.training.global_vars", raising=False)
    metrics = StepMetrics(step=0, rank=0, phase="warmup", time_s=1.0, energy_j=2.0, clock_mhz=1410,
                          energy_j_total=2.0, saving_j_total=0.0, straggler_ratio=1.0)
    sink = MegatronWritersSink()
    sink.write(0, metrics)
    sink.close()
    assert "megatron.training.global_vars" not in sys.modules, "the sink never imports Megatron-LM"


def test_iteration_log_line_gets_perseus_numbers_only_in_training_log(trainer, tmp_path):
    """A stand-in for megatron.training.training: ``training_log`` builds the line and prints it
    with the module's ``print_rank_last``, as Megatron-LM's does (the real one runs in
    test_megatron_lm_pretrain_gpt.py)."""
    printed: list[str] = []
    training = types.ModuleType("megatron.training.training")
    exec(  # module code looking up print_rank_last in its globals, like Megatron-LM's
        "def training_log(iteration):\n"
        "    print_rank_last(' [2026] iteration {:8d}/      10 | lm loss: 1.0 |'.format(iteration))\n"
        "    return True\n",
        training.__dict__,
    )
    training.print_rank_last = printed.append
    handle = enable(gpu="sim", device_index=0, sim_gpu=sim_gpu(tmp_path),
                    cache_dir=None, warmup_steps=2, mode="measure-only", log_every_steps=0,
                    straggler_period_steps=0)
    undo = add_to_iteration_log(handle, training)
    assert undo is not None and add_to_iteration_log(handle, training) is None  # once
    try:
        training.training_log(0)  # before the first step: nothing to add
        with cpu_execution():
            for i in range(1, 4):
                trainer.step(MICROBATCHES)
                assert training.training_log(i) is True
        training.print_rank_last("validation loss at iteration 3 | 1.0")  # other prints unchanged
        records = list(handle.runtime.reporter.records)
        baseline = handle.runtime.reporter.baseline_energy_j
    finally:
        handle.close()
        undo()
    assert training.print_rank_last == printed.append
    assert printed[0].endswith("lm loss: 1.0 |") and printed[-1] == "validation loss at iteration 3 | 1.0"
    last = printed[3]
    assert f"perseus energy this GPU (J/iter): {records[2].energy_j:.1f} |" in last
    assert f"perseus power this GPU (W): {records[2].energy_j / records[2].time_s:.1f} |" in last
    assert f"perseus saved this GPU (J): {baseline - records[2].energy_j:.1f} |" in last
    assert "perseus phase: steady" in last and "perseus phase: warmup" in printed[1]
    assert "perseus saved" not in printed[1]  # no baseline yet
    assert IterationLogText(handle)() != ""  # a fresh reader starts from the first step


def test_the_writers_and_the_log_line_get_the_job_saving_against_the_probes(trainer, tmp_path, monkeypatch):
    """With the guard's default-clock probes on, every probe window's end gives the writers the job's
    saving (all ranks, all pipelines: here one) and every stage's energy, and the log line the job's
    saving with its interval."""
    save_frontier(Frontier(build_schedule("1f1b", 1, MICROBATCHES), 80.0, 1.0, 2.0,
                           [FrontierPoint(1.0, 3.0, np.array(PLAN))]), tmp_path / "f.json")
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    wandb = Wandb()
    global_vars = types.ModuleType("megatron.training.global_vars")
    global_vars.get_tensorboard_writer = lambda: writer
    global_vars.get_wandb_writer = lambda: wandb
    monkeypatch.setitem(sys.modules, "megatron.training.global_vars", global_vars)
    printed: list[str] = []
    training = types.ModuleType("megatron.training.training")
    exec("def training_log(iteration):\n    print_rank_last(' iteration {:8d} |'.format(iteration))\n", training.__dict__)
    training.print_rank_last = printed.append
    handle = enable(gpu="sim", device_index=0, sim_gpu=sim_gpu(tmp_path), cache_dir=None, warmup_steps=2,
                    frontier_path=str(tmp_path / "f.json"), log_every_steps=0, probe_every_steps=4)
    undo = add_to_iteration_log(handle, training)
    try:
        with cpu_execution():
            for _ in range(14):
                trainer.step(MICROBATCHES)
        training.training_log(14)
        windows = [r.step for r in handle.runtime.reporter.records if r.job_saving is not None]
        figure = handle.runtime.observe.job_saving.figure
    finally:
        handle.close()
        undo()
    writer.close()
    assert figure is not None and len(windows) == figure.windows >= 2
    scalars = read_scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["perseus/job_saving_ratio"]] == windows  # at the steps a window ended
    assert scalars["perseus/job_saving_ratio"][-1][1] == pytest.approx(figure.saving, rel=1e-6)
    assert scalars["perseus/job_saving_low_ratio"][-1][1] == pytest.approx(figure.saving_low, rel=1e-6)
    assert scalars["perseus/stage0_energy_j"][-1][1] == pytest.approx(figure.stages[0].energy_j, rel=1e-6)
    assert scalars["perseus/stage0_baseline_energy_j"][-1][1] == pytest.approx(figure.baseline_energy_j, rel=1e-6)
    assert wandb.logged[windows[-1]][0]["perseus/job_saving_ratio"] == figure.saving
    assert (f"perseus job saving all GPUs vs default clocks: {100 * figure.saving:.1f}% (95 % interval "
            f"{100 * figure.saving_low:.1f}..{100 * figure.saving_high:.1f}%) |") in printed[-1]
