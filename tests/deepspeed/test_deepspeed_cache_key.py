"""The cache key is the model: every ingredient DeepSpeed's adapter puts in it, changed alone, misses
the cache; the same model (fresh objects, other weights) hits it.

Real ``PipelineModule``s and engines in this process (one rank, gloo, CPU) and the real runtime
(measure-only, simulated GPU): the cache entry it opens is the one a run would profile into. The
2-stage ingredients (the partition, a model changed on stage 1 only) are checked under torchrun in
``test_deepspeed_cache_key_distributed``.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

import torch
from deepspeed.pipe import LayerSpec, PipelineModule

from perseus_deepspeed import get_handle, initialize
from perseus_deepspeed.job import layer_specs
from perseus_demo.tiny_pipe import TinyPipeShape, client_optimizer, deepspeed_config
from perseus.runtime.supply.fingerprint import KEY_VERSION

HIDDEN = 8


class Head(torch.nn.Module):
    """A classifier head given as a module instance (AlexNet-like: only ``num_classes`` differs)."""

    def __init__(self, num_classes: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(HIDDEN, num_classes, dtype=dtype)

    def forward(self, x):
        return self.fc(x)


BASE = {"slope": 0.1, "bias": True, "classes": 10, "dtype": torch.float32, "micro_batch_size": 2,
        "microbatches": 2, "checkpoint_interval": 0, "loss": torch.nn.MSELoss}

CHANGES = {
    "layer spec argument": {"slope": 0.2},
    "layer spec keyword argument": {"bias": False},
    "module instance's parameter shapes": {"classes": 1000},
    "module instance's parameter dtype": {"dtype": torch.float64},
    "micro-batch size": {"micro_batch_size": 4},
    "gradient accumulation steps": {"microbatches": 4},
    "activation checkpoint interval": {"checkpoint_interval": 1},
    "loss function": {"loss": torch.nn.L1Loss},
}


def build(seed: int = 0, **changes):
    v = {**BASE, **changes}
    torch.manual_seed(seed)
    layers = [LayerSpec(torch.nn.Linear, HIDDEN, HIDDEN, bias=v["bias"]), LayerSpec(torch.nn.LeakyReLU, v["slope"]),
              Head(v["classes"], v["dtype"])]
    model = PipelineModule(layers=layers, num_stages=1, loss_fn=v["loss"](), partition_method="uniform",
                           activation_checkpoint_interval=v["checkpoint_interval"])
    return model, v


def cache_entry(tmp_path, monkeypatch, seed: int = 0, **changes):
    """The cache directory the real runtime opens for this model (its key hash)."""
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    model, v = build(seed, **changes)
    section = {"gpu": "sim", "sim_gpu": {"energy_update_period_s": 0}, "mode": "measure-only",
               "cache_dir": str(tmp_path / "cache"), "log_every_steps": 0}
    config = deepspeed_config(v["microbatches"], TinyPipeShape(HIDDEN, 1, v["micro_batch_size"]), section)
    engine, *_ = initialize(model=model, optimizer=client_optimizer(model), config=config)
    runtime = get_handle(engine).runtime
    try:
        return runtime.cache.dir, runtime.cache.key
    finally:
        engine.destroy()


@pytest.fixture(scope="module")
def base_entry(dist_world, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        return cache_entry(tmp_path_factory.mktemp("base"), mp)


def test_the_same_model_hits_the_cache(base_entry, tmp_path, monkeypatch):
    again, key = cache_entry(tmp_path, monkeypatch, seed=7)  # new objects, other weights
    assert again.name == base_entry[0].name
    assert key["key_version"] == KEY_VERSION and key["stage_models"].keys() == {"0"}


@pytest.mark.parametrize("ingredient", list(CHANGES))
def test_each_changed_ingredient_misses_the_cache(ingredient, base_entry, tmp_path, monkeypatch):
    changed, key = cache_entry(tmp_path, monkeypatch, **CHANGES[ingredient])
    assert changed.name != base_entry[0].name, f"changing the {ingredient} reused the cache entry"


@pytest.mark.parametrize("ingredient", ["module instance's parameter shapes", "module instance's parameter dtype"])
def test_module_instances_are_keyed_by_their_parameters_on_every_rank(ingredient, dist_world):
    """The layer-spec list every rank holds describes an instance by its parameters, so rank 0's key
    changes even when the instance lives on another stage (the reported AlexNet 10 → 1000 bug)."""
    base, _ = build()
    changed, _ = build(**CHANGES[ingredient])
    assert layer_specs(base)[2] != layer_specs(changed)[2]
    assert layer_specs(base)[:2] == layer_specs(changed)[:2]
    assert layer_specs(base)[2]["module"].endswith("Head")


@pytest.mark.distributed
def test_two_stages_partition_and_a_model_changed_on_stage_1_only_miss(tmp_path):
    """torchrun, 2 ranks: rank 0's key covers stage 1's parameters (gathered) and the partition."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim"),
               PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).with_name("deepspeed_cache_key_worker.py")), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    paths = [tmp_path / f"rank{r}.json" for r in range(2)]
    assert all(p.exists() for p in paths), f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    rank0, rank1 = (json.loads(p.read_text()) for p in paths)
    entries = rank0["entries"]
    assert all(rank1["entries"][name] is None for name in entries)  # rank 0 alone owns the cache
    assert entries["base again"] == entries["base"]
    assert rank0["partition"]["partition"] != rank0["partition"]["base"]
    assert entries["partition"] != entries["base"]
    assert entries["stage 1 dtype"] != entries["base"], "a model changed on stage 1 only reused rank 0's entry"
