"""Real torch.distributed.pipelining runs (gloo, CPU, simulated GPUs), one launch per rank count.

A launch is what costs (every rank starts torch), not the tiny model: one torchrun of 2 ranks and
one of 4 run, one after another in one process group,

1. **the recorded orders** (``orders_worker.py``): what perseus_torch reports is exactly the
   schedule data Perseus plans with, for every supported schedule; eval() and unhooked steps
   report nothing; uninstall leaves the stages and schedule as they were. Each case is its own test.
2. **the torch demo** (``perseus_demo.torch_demo``'s rank body) end to end: online profiling,
   planning and deployment on the schedules only torch has, Interleaved1F1B and the zero-bubble
   ones (ZB-interleaved on 2 ranks, ZBV on 4: its V placement on 2 ranks is checked by the order
   cases), and DualPipeV's fused forward+backward units (2 ranks). 1F1B's plan is deployed in the Megatron and DeepSpeed demos, and torch's Schedule1F1B
   reports exactly that schedule's data (the order cases, 2 and 4 ranks). The plan deploys without
   fallback only if every reported instruction matched the schedule data (the runtime checks each
   one); the checks are on what the run did (``tests/demo_checks.py``), not on wall-clock time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from dataclasses import asdict
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import check_deployed_demo

from perseus.schedules import build_schedule
from perseus.schedules.dependencies import dependencies
from perseus_demo.common import format_report, phase_table
from perseus_demo.torch_demo import DemoConfig

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]

CASES = [
    ("1f1b", 2, 1, 4), ("gpipe", 2, 1, 3), ("torch-interleaved", 2, 2, 4), ("zb-interleaved", 2, 2, 4),
    ("zbv", 2, 2, 4), ("zb-interleaved", 2, 1, 3),
    ("1f1b", 4, 1, 6), ("zbv", 4, 2, 8), ("torch-interleaved", 4, 2, 8),
    ("dualpipev", 2, 2, 4), ("dualpipev", 2, 2, 6), ("dualpipev", 4, 2, 8),
]


DEMOS = [("torch-interleaved", 2, 2, 4), ("zb-interleaved", 2, 2, 4), ("zbv", 4, 2, 8), ("dualpipev", 2, 2, 6)]
# The demo on the asynchronous simulated GPU (the host runs ahead of each GPU's stream), same launch.
ASYNC_DEMO = ("1f1b", 2, 1, 4)
ASYNC_DEPTH = 8


def case_id(schedule: str, stages: int, chunks: int, microbatches: int, stream_depth: int = 0) -> str:
    return f"{schedule}-{stages}-{chunks}-{microbatches}" + (f"-async{stream_depth}" if stream_depth else "")


def demo_config(schedule: str, stages: int, chunks: int, microbatches: int, cache_dir: Path,
                stream_depth: int = 0) -> DemoConfig:
    # max_steps only bounds a run that never deploys: planning runs in the background while training
    # goes on, so on a busy machine (or beside another pytest-xdist worker) it takes more iterations
    # (ZBV 2x2 took 141 of 150 beside one). The launch's timeout is the hang guard.
    cfg = DemoConfig(stages=stages, chunks=chunks, microbatches=microbatches, schedule=schedule, max_steps=1000,
                     deployed_steps=4, startup_steps=1, rebaseline_steps=2)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250, cache_dir=str(cache_dir))
    cfg.sim_gpu = {**cfg.sim_gpu, "stream_depth": stream_depth}
    return cfg


Launch = dict[str, Any]  # "orders": case id -> each rank's result; "demos": case id -> (folder, config, each rank's result)


def run_launch(tmp_path: Path, stages: int) -> Launch:
    """One torchrun of ``stages`` ranks: every order case of that size, then every demo of that size."""
    cases = {case_id(*case): {"stages": stages, "chunks": case[2], "microbatches": case[3], "schedule": case[0],
                              "hidden_size": 8, "micro_batch_size": 2}
             for case in CASES if case[1] == stages}
    demos = {}
    async_demo = [(*ASYNC_DEMO, ASYNC_DEPTH)] if ASYNC_DEMO[1] == stages else []
    for case in [*(c for c in DEMOS if c[1] == stages), *async_demo]:
        folder = tmp_path / case_id(*case)
        folder.mkdir()
        depth = case[4] if len(case) > 4 else 0
        cfg = demo_config(*case[:4], cache_dir=folder / "cache", stream_depth=depth)
        (folder / "config.json").write_text(json.dumps(asdict(cfg)))
        demos[case_id(*case)] = (folder, cfg)
    env = dict(os.environ, OMP_NUM_THREADS="1", PERSEUS_GPU="sim", PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim-gpus"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={stages}",
           str(ROOT / "tests/torch/orders_worker.py"), str(tmp_path), json.dumps(cases),
           json.dumps([str(folder) for folder, _ in demos.values()])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)  # a hang guard
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(stages)]
    return {"orders": {name: [rank[name] for rank in ranks] for name in cases},
            "demos": {name: (folder, cfg, [json.loads((folder / f"rank{r}.json").read_text()) for r in range(stages)])
                      for name, (folder, cfg) in demos.items()}}


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> Callable[[int], Launch]:
    """Each rank count's launch, run the first time a test of that size asks for it (a failed one is not retried)."""
    done: dict[int, Launch | BaseException] = {}

    def get(stages: int) -> Launch:
        if stages not in done:
            try:
                done[stages] = run_launch(tmp_path_factory.mktemp(f"pp{stages}"), stages)
            except BaseException as exc:  # noqa: BLE001 - every test of this size reports the launch's failure
                done[stages] = exc
        result = done[stages]
        if isinstance(result, BaseException):
            raise result
        return result

    return get


@pytest.mark.parametrize("schedule,stages,chunks,microbatches", CASES)
def test_reported_orders_equal_the_schedule_data(launches, schedule, stages, chunks, microbatches):
    data = build_schedule(schedule, stages, microbatches, chunks)
    results = launches(stages)["orders"][case_id(schedule, stages, chunks, microbatches)]
    assert [r["rank"] for r in results] == list(range(stages))
    for result in results:
        rank = result["rank"]
        want = [[i.kind, i.microbatch, i.chunk, *(i.backward_pair() or ())] for i in data.stages[rank]]
        assert result["trained_steps"] == 2 and result["steps"] == [want, want], f"rank {rank}"
        assert result["after_eval"] == 2 and result["after_uninstall"] == 2
        assert result["restored"]
        assert result["torch_stages"] == sorted(data.virtual_stage(rank, c) for c in range(chunks))


@pytest.mark.parametrize("schedule,stages,chunks,microbatches", DEMOS)
def test_torch_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(launches, schedule, stages, chunks,
                                                                        microbatches):
    folder, cfg, results = launches(stages)["demos"][case_id(schedule, stages, chunks, microbatches)]
    for result in results:
        assert len(result["summary"]["profiled_clocks_mhz"]) >= 2
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    accounting = check_deployed_demo(results, cfg, folder / "cache")
    print(f"\n{schedule}, {stages} ranks:\n{format_report(table)}\n{accounting}")


def test_torch_demo_on_the_asynchronous_gpu_deploys_and_times_steps_in_gpu_time(launches):
    """The host runs ahead of each simulated GPU's stream: the plan still deploys, each iteration
    is the GPU's time (events on the stream), the runtime timed its steps in GPU time, and no
    kernel started before a kernel of another stage it depends on had ended: a sending
    instruction's kernel is waited for before the framework's send (without that wait a stage's
    kernel started while the one producing its input still ran)."""
    schedule_name, stages, chunks, microbatches = ASYNC_DEMO
    folder, cfg, results = launches(stages)["demos"][case_id(*ASYNC_DEMO, ASYNC_DEPTH)]
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    check_deployed_demo(results, cfg, folder / "cache")
    for result in results:
        for rec in result["steps"]:
            kernels = rec["instruction_times"]
            assert len(kernels) == len(rec["instructions"]) == 2 * microbatches
            # the iteration spans its kernels in GPU time: from the step-begin event to the step-end one
            assert rec["gpu_begin_s"] <= kernels[0][0] and kernels[-1][1] <= rec["gpu_begin_s"] + rec["time_s"] + 1e-9
            if rec["phase"] == "baseline again":  # the runtime stopped: only the demo times it
                assert rec["gpu_step_s"] is None
            elif rec["phase"] != "startup":  # StepMetrics.gpu_step_s: first instruction begin to the step's end
                assert 0 < rec["gpu_step_s"] <= rec["time_s"] + 1e-3, rec
                assert rec["gpu_step_s"] >= kernels[-1][1] - kernels[0][0] - 1e-3, rec
    schedule = build_schedule(schedule_name, stages, microbatches, chunks)
    by_stage = {r["stage"]: {rec["step"]: rec["instruction_times"] for rec in r["steps"]} for r in results}
    late = []
    for (us, ui), (vs, vi) in dependencies(schedule):
        if us != vs:
            for step, times in by_stage[vs].items():
                if times[vi][0] < by_stage[us][step][ui][1] - 1e-6:
                    late.append(f"step {step}: stage {vs} #{vi} began before stage {us} #{ui} ended")
    assert late == []
