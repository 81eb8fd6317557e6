"""Perseus in TorchTitan: the ``perseus`` section of its job config, the rank's place from its parallel
degrees, and TorchTitan's own trainer with Perseus attached.

The mapping and the section need neither TorchTitan nor a process group. The job-config route goes
through TorchTitan's own ``ConfigManager`` (``--module``/``--config``, ``--perseus.<field>``); the
trainer run is ``torchtitan.train.main`` under torchrun (4 ranks: 2 pipeline stages x 2 DDP replicas,
gloo, simulated GPUs), with the bridges titan_worker.py lists. Both skip where TorchTitan 0.3 (with
its dependencies) is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.errors import ConfigError
from perseus.runtime import PerseusConfig
from perseus_torch.integration import data_parallel
from perseus_torch.titan_mesh import MeshPosition, TitanDegrees, mesh_position
from perseus_torch.titan_section import JSON_FIELDS, PerseusSection, section_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def degrees(pp: int = 2, dp_replicate: int = 1, dp_shard: int = 1, cp: int = 1, tp: int = 1) -> TitanDegrees:
    return TitanDegrees(pp, dp_replicate, dp_shard, cp, tp, pp * dp_replicate * dp_shard * cp * tp)


def test_a_rank_s_place_follows_titan_s_mesh_layout():
    """TorchTitan unflattens its world mesh as (pp, batch, cp, tp), outermost first: every DDP replica
    and FSDP shard is a pipeline of its own, context and tensor parallel ranks one stage's group."""
    d = degrees(pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2)  # 32 ranks
    assert mesh_position(0, d) == MeshPosition(stage=0, num_stages=2, dp_rank=0, dp_size=4, tp_rank=0, tp_size=4)
    rank = ((1 * 4 + 3) * 2 + 1) * 2 + 0  # stage 1, batch 3, cp 1, tp 0
    assert mesh_position(rank, d) == MeshPosition(1, 2, 3, 4, 2, 4)
    seen = {(p.stage, p.dp_rank, p.tp_rank) for p in (mesh_position(r, d) for r in range(d.world_size))}
    assert len(seen) == d.world_size, "every rank has a place of its own"
    assert mesh_position(3, degrees(pp=4)) == MeshPosition(3, 4, 0, 1, 0, 1)


@pytest.mark.parametrize("d, words", [
    (degrees(pp=1, dp_shard=8), ["pipeline_parallel_degree is 1", "--parallelism.pipeline_parallel_degree 2"]),
    (TitanDegrees(2, 1, 2, 1, 1, 8), ["is not the world size 8"]),
])
def test_a_layout_perseus_cannot_follow_is_refused_in_one_line(d, words):
    with pytest.raises(ConfigError) as info:
        mesh_position(0, d)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words)


def test_perseus_torch_never_takes_one_pipeline_where_the_world_holds_more():
    assert data_parallel(pp=2, world=2, dp_rank=None, dp_size=None) == (0, 1)
    assert data_parallel(pp=2, world=8, dp_rank=1, dp_size=2, tp_size=2) == (1, 2)
    for args, words in (((2, 8, None, None), "pass dp_rank and dp_size"), ((2, 8, 1, None), "together"),
                        ((2, 8, 0, 2), "the world has 8")):
        with pytest.raises(ConfigError, match=words) as info:
            data_parallel(*args)
        assert "\n" not in str(info.value)


def test_the_section_holds_every_setting_at_its_default():
    import dataclasses

    assert [f.name for f in dataclasses.fields(PerseusSection)] == list(PerseusConfig.model_fields)
    assert section_config(PerseusSection()) == PerseusConfig()
    assert JSON_FIELDS == {"sim_gpu", "planner_options"}
    section = PerseusSection(mode="measure-only", cache_dir=None, sim_gpu='{"stream_depth": 2}', probe_every_steps=8)
    config = section_config(section)
    assert (config.mode.value, config.cache_dir, config.sim_gpu, config.probe_every_steps) == (
        "measure-only", None, {"stream_depth": 2}, 8)


@pytest.mark.parametrize("change, words", [
    ({"sim_gpu": "{stream_depth: 2}"}, "--perseus.sim_gpu: not a JSON object"),
    ({"probe_every_steps": 3}, r"perseus section \(--perseus.<field>\): .*probe_every_steps \(3\)"),
])
def test_a_bad_setting_is_one_line_naming_it(change, words):
    with pytest.raises(ConfigError, match=words) as info:
        section_config(PerseusSection(**change))
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- with TorchTitan installed

def _titan():
    """TorchTitan's trainer module, or a clean skip saying why not."""
    pytest.importorskip("torchtitan", reason="torchtitan 0.3 is not installed (pip install -e '.[torchtitan]')")
    try:
        import torchtitan.trainer
        from torchtitan.config import ConfigManager
    except ImportError as exc:  # e.g. triton, which torchtitan.trainer imports and CPU torch does not bring
        pytest.skip(f"torchtitan.trainer does not import here: {exc}")
    return torchtitan.trainer, ConfigManager


def test_a_shipped_config_gets_a_perseus_section_through_titan_s_config_manager():
    trainer, ConfigManager = _titan()
    from perseus_torch.torchtitan import PerseusTrainer

    config = ConfigManager().parse_args([
        "--module", "perseus_torch.torchtitan", "--config", "llama3_debugmodel",
        "--perseus.mode", "measure-only", "--perseus.probe_every_steps", "8", "--perseus.cache_dir", "None",
        "--perseus.sim_gpu", '{"stream_depth": 2}', "--training.steps", "3"])
    assert type(config) is PerseusTrainer.Config and config._owner is PerseusTrainer  # config.build() makes ours
    assert config.training.steps == 3 and config.model_spec.flavor == "debugmodel"
    perseus = section_config(config.perseus)
    assert (perseus.mode.value, perseus.probe_every_steps, perseus.cache_dir, perseus.sim_gpu) == (
        "measure-only", 8, None, {"stream_depth": 2})
    assert config.to_dict()["perseus"]["probe_every_steps"] == 8  # TorchTitan's own config dump has it


def test_a_user_s_registry_with_perseus_reaches_perseus_config(tmp_path, monkeypatch):
    trainer, ConfigManager = _titan()
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("TITAN_ASSETS", str(tmp_path))
    config = ConfigManager().parse_args(["--module", "titan_job", "--config", "perseus_debug",
                                         "--perseus.guard_threshold", "7.5"])
    perseus = section_config(config.perseus)
    assert (perseus.gpu, perseus.cache_dir, perseus.probe_every_steps, perseus.guard_threshold) == ("sim", None, 4, 7.5)
    assert config.parallelism.pipeline_parallel_degree == 2


def test_with_perseus_refuses_unknown_settings_and_custom_trainers():
    trainer, _ = _titan()
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from perseus_torch.torchtitan import with_perseus

    with pytest.raises(ConfigError, match="unknown setting.*probe_every"):
        with_perseus(llama3_debugmodel(), probe_every=4)
    with pytest.raises(ConfigError, match="probe_every_steps"):
        with_perseus(llama3_debugmodel(), probe_every_steps=3)
    config = with_perseus(llama3_debugmodel(), mode="measure-only")
    with pytest.raises(ConfigError, match="custom trainer"):
        with_perseus(config)


@pytest.mark.distributed
def test_titan_s_own_trainer_profiles_plans_and_deploys_with_perseus(tmp_path):
    """``torchtitan.train.main`` on 2 stages x 2 DDP replicas: every rank's place comes from TorchTitan's
    mesh, the run profiles, plans and deploys on the simulated GPUs following TorchTitan's own 1F1B
    schedule, the job's saving covers both stages of both pipelines, and TorchTitan's TensorBoard
    logger gets Perseus's scalars."""
    titan, _ = _titan()
    from titan_job import write_assets

    write_assets(tmp_path)
    out = tmp_path / "ranks"
    out.mkdir()
    site = str(Path(titan.__file__).resolve().parents[1])
    env = {**os.environ, "TITAN_ASSETS": str(tmp_path), "TITAN_OUT": str(out), "TITAN_DP_REPLICATE": "2",
           "PERSEUS_SIM_GPU_DIR": str(tmp_path / "sim"), "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), site, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
           str(HERE / "titan_worker.py"), "--module", "titan_job", "--config", "perseus_debug",
           "--perseus.mode", "run"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, r in enumerate(results):
        assert r["job"] == {"stage": rank // 2, "num_stages": 2, "dp_rank": rank % 2, "dp_size": 2, "tp_rank": 0,
                            "tp_size": 1, "schedule": "1f1b"}
        phases = [p for _, p in r["summary"]["phase_history"]]
        assert phases[:4] == ["warmup", "profiling", "planning", "deployed"], phases
    assert "no longer match the plan" not in proc.stderr + proc.stdout  # TorchTitan's schedule ran the plan's order
    job = results[0]["summary"]["job_saving"]
    assert job is not None and all(r["summary"]["job_saving"] == job for r in results)
    assert {s: v["ranks"] for s, v in job["stages"].items()} == {"0": 2, "1": 2}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = [p.parent for p in (tmp_path / "out").rglob("events.out.tfevents.*")]  # on its metrics rank
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"perseus/energy_j", "perseus/job_saving_ratio", "perseus/stage0_energy_j",
            "perseus/stage1_energy_j"} <= tags
    assert acc.Scalars("perseus/job_saving_ratio")[-1].value == pytest.approx(job["saving"], rel=1e-5)
