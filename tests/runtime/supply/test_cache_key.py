"""The runtime's cache key: its layout version, entries of the old layout, and descriptions that
are equal across processes (no memory address), so the same model hits its cache entry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types

import torch

from perseus.store.cache import RunCache, key_hash
from perseus.gpu.sim.device import SimulatedGPU
from perseus.profile import load_json
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob, describe_value, value_digest
from perseus.runtime.supply.fingerprint import KEY_VERSION
from perseus.runtime.supply.sources import software_versions, stage_gpus

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0, model_config={"hidden": 8}, stage_fingerprint="abc")


def config(tmp_path, **kw):
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 2,
                                    "p_blocking_seconds": 0.05, "freq_min_mhz": 1200, "freq_step_mhz": 100,
                                    "iters_per_freq": 1, "remeasure_max": 0, **kw})  # exact step counts


def train(runtime, steps):
    for _ in range(steps):
        runtime.on_step_begin()
        for inst in runtime.schedule.stages[0]:
            runtime.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            time.sleep(0.001)
            runtime.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        runtime.on_step_end()


def test_the_key_holds_its_version_the_model_every_stage_its_gpu_and_the_software(tmp_path):
    gpu = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    with PerseusRuntime(JOB, config(tmp_path, mode="measure-only")) as rt:
        key = rt.cache.key
    assert key["key_version"] == KEY_VERSION == 3
    assert key["model"] == {"hidden": 8} and key["stage_models"] == {"0": "abc"} and key["dp_size"] == 1
    assert key["stage_gpus"] == {"0": [{"name": gpu.name, "power_limit_w": round(gpu.model.tdp_w),
                                        "memory_clock_mhz": gpu.max_memory_clock_mhz()}]}
    assert key["torch_version"] == torch.__version__  # CPU torch here: no CUDA, no NCCL
    assert key["cuda_version"] is None and key["nccl_version"] is None


def profiled_then_reran(tmp_path, between) -> tuple[list[str], list[str]]:
    """Phases of a run that profiles into the cache and of a second run after ``between()``."""
    phases = []
    for change in (lambda: None, between):
        change()
        with PerseusRuntime(JOB, config(tmp_path, mode="profile")) as rt:
            train(rt, 6)
            phases.append([p for _, p in rt.summary()["phase_history"]])
    return phases[0], phases[1]


def test_a_profile_is_reused_while_nothing_in_its_key_changed(tmp_path):
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    first, again = profiled_then_reran(tmp_path, lambda: None)
    assert "profiling" in first and "profiling" not in again


def test_a_profile_cached_under_one_power_limit_is_not_reused_under_another(tmp_path):
    """A lower power limit lowers the clock the card sustains, so the old profile is stale."""
    gpu = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    first, after = profiled_then_reran(tmp_path, lambda: gpu.set_power_limit_w(gpu.model.tdp_w - 100.0))
    assert "profiling" in first and "profiling" in after
    assert len(list((tmp_path / "cache").iterdir())) == 2  # the old entry is kept for the old limit


def test_a_power_limit_within_a_watt_keeps_the_profile(tmp_path):
    gpu = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    first, after = profiled_then_reran(tmp_path, lambda: gpu.set_power_limit_w(gpu.model.tdp_w - 0.2))
    assert "profiling" in first and "profiling" not in after


class Gathered:
    """Rank 0's end of a gather whose other ranks sent ``others``."""

    def __init__(self, others: list) -> None:
        self.others = others

    def gather_to_root(self, obj):
        return [obj, *self.others]


def test_every_stage_s_gpu_settings_are_in_the_key_each_distinct_once():
    """A power limit lowered on one node slows its stage alone: the key names it per stage."""
    mine = {"name": "H100", "power_limit_w": 700, "memory_clock_mhz": 2619}
    capped = {**mine, "power_limit_w": 500}
    port = types.SimpleNamespace(key_settings=lambda: dict(mine))
    job = PipelineJob(num_stages=2, num_microbatches=2, stage=0)
    found = stage_gpus(Gathered([(0, mine), (1, mine), (1, capped)]), job, port)
    assert found == {"0": [mine], "1": [capped, mine]}


def fake_torch(version: str, cuda: str | None = None, nccl: object = None) -> types.SimpleNamespace:
    """What ``software_versions`` reads of torch; CUDA available where ``cuda`` is given."""
    return types.SimpleNamespace(
        __version__=version, version=types.SimpleNamespace(cuda=cuda),
        cuda=types.SimpleNamespace(is_available=lambda: cuda is not None,
                                   nccl=types.SimpleNamespace(version=lambda: nccl)))


def test_a_profile_cached_under_one_torch_is_not_reused_under_another(tmp_path, monkeypatch):
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    monkeypatch.setitem(sys.modules, "torch", fake_torch("2.4.0"))
    first, after = profiled_then_reran(tmp_path, lambda: monkeypatch.setitem(sys.modules, "torch", fake_torch("2.5.1")))
    assert "profiling" in first and "profiling" in after


def test_software_versions_name_cuda_and_nccl_only_where_cuda_is_available(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch("2.5.1+cu124", "12.4", (2, 21, 5)))
    assert software_versions() == {"torch_version": "2.5.1+cu124", "cuda_version": "12.4", "nccl_version": "2.21.5"}
    monkeypatch.setitem(sys.modules, "torch", fake_torch("2.5.1+cpu"))
    assert software_versions() == {"torch_version": "2.5.1+cpu", "cuda_version": None, "nccl_version": None}
    monkeypatch.setitem(sys.modules, "torch", None)  # not installed: ``import torch`` raises ImportError
    assert software_versions() == {"torch_version": None, "cuda_version": None, "nccl_version": None}


def test_an_entry_of_the_old_key_layout_is_never_read_and_breaks_nothing(tmp_path):
    """After an upgrade the cache holds entries keyed the old way (no version, no stage models): the
    first run profiles again into a new entry and leaves the old one alone."""
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    with PerseusRuntime(JOB, config(tmp_path, mode="profile")) as rt:
        train(rt, 6)
        new_key, new_dir = rt.cache.key, rt.cache.dir
    old_key = {k: v for k, v in new_key.items() if k not in ("key_version", "stage_models", "dp_size")}
    old = RunCache(tmp_path / "cache", old_key)
    old.save_profile(load_json(new_dir / "profile.json"))
    shutil.rmtree(new_dir)
    assert old.dir != new_dir and old.load_profile() is not None
    with PerseusRuntime(JOB, config(tmp_path, mode="profile")) as rt:
        train(rt, 6)
        assert [p for _, p in rt.summary()["phase_history"]] == ["warmup", "profiling", "steady"]
        assert not [d for _, what, d in rt.events if what == "source"]
    assert (new_dir / "profile.json").exists() and (old.dir / "profile.json").exists()
    assert json.loads((old.dir / "key.json").read_text()) == json.loads(json.dumps(old_key, sort_keys=True))


class Opaque:
    """An argument with the default repr, which holds a memory address."""


def test_descriptions_hold_no_address_and_are_equal_across_processes():
    described = describe_value({"arg": Opaque(), "fn": test_descriptions_hold_no_address_and_are_equal_across_processes})
    assert "0x" not in json.dumps(described)
    code = ("import sys; sys.path.insert(0, {here!r}); import test_cache_key as t; "
            "from perseus.runtime import value_digest; "
            "print(value_digest({{'arg': t.Opaque(), 'fn': t.test_descriptions_hold_no_address_and_are_equal_across_processes}}))")
    here = os.path.dirname(__file__)
    other = subprocess.run([sys.executable, "-c", code.format(here=here)], capture_output=True, text=True, check=True)
    import test_cache_key as same  # the module as the child imports it
    mine = value_digest({"arg": same.Opaque(), "fn": same.test_descriptions_hold_no_address_and_are_equal_across_processes})
    assert other.stdout.strip() == mine
    assert key_hash({"a": mine}) == key_hash({"a": other.stdout.strip()})
