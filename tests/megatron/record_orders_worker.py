"""torchrun worker: run real megatron-core pipelines on CPU and record each rank's executed orders.

Usage: torchrun --nproc_per_node N record_orders_worker.py OUT_DIR CASE [CASE ...]
A case is ``NAME:schedule:stages:chunks:microbatches[:eval|:overlap]``: ``stages`` pipeline stages,
the world's other factor data-parallel replicas (megatron-core's parallel state is set up again for
each case); ``eval`` adds a forward-only call between the two training steps (it must not be
reported); ``overlap`` turns on megatron-core's ``overlap_p2p_comm`` (batched p2p off, as megatron
requires), pads every forward by 10 ms and backward by 30 ms (more on later stages, so stages wait
on each other) and also records when each instruction began and ended. Each rank writes
``OUT_DIR/rank<R>.json``: {case: {"steps": [[[kind, mb, chunk], ...], ...], "stage": s,
"dp_rank": d}} (with ``overlap`` also "times": [[[begin, end], ...], ...], "losses" (how many this
rank saw: the last stage's) and "finite_losses"), plus an ``enable`` case when CASE is ``enable:STAGES``: the job
built by ``perseus_megatron.enable`` on that many stages. ``demo:DIR`` runs, after every other
case and once the results are written, the Megatron demo rank (``perseus_demo.megatron_demo``)
with ``DIR/config.json``, writing its ``DIR/rank<R>.json``: the same run as a launch of the demo,
without starting torch and megatron-core again.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def where() -> dict[str, int]:
    """This rank's pipeline stage and data-parallel replica, as megatron-core's parallel state has them."""
    from megatron.core import parallel_state

    return {"stage": parallel_state.get_pipeline_model_parallel_rank(), "dp_rank": parallel_state.get_data_parallel_rank()}


def run_case(spec: str) -> dict[str, Any]:
    from perseus.runtime.job import RecordingListener
    from perseus_megatron.hooks import install_hooks
    from perseus_demo.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel

    _, schedule, stages_text, chunks_text, microbatches_text, *extra = spec.split(":")
    stages, chunks, microbatches = int(stages_text), int(chunks_text), int(microbatches_text)
    vp = chunks if schedule == "interleaved" else None
    initialize_parallel(stages, vp)
    trainer = TinyGPTTrainer(TinyGPTShape(num_layers=stages * chunks), stages, vp)
    overlap = "overlap" in extra
    if overlap:
        trainer.config.overlap_p2p_comm, trainer.config.batch_p2p_comm = True, False
    recorder = StampingListener(where()["stage"]) if overlap else RecordingListener()
    losses = []
    with install_hooks(recorder):
        losses += trainer.step(microbatches)
        if "eval" in extra:
            trainer.step(microbatches, forward_only=True)
        losses += trainer.step(microbatches)
    steps = [[[i.kind, i.microbatch, i.chunk] for i in step] for step in recorder.steps]
    if not overlap:
        return {"steps": steps, **where()}
    finite = all(math.isfinite(float(loss["lm loss"])) for loss in losses)
    return {"steps": steps, "times": recorder.times, "losses": len(losses), "finite_losses": finite, **where()}


class StampingListener:
    """Records the order and when each instruction began and ended, padding each one as a GPU
    kernel would last (a sleep before the hook returns, so the schedule's send follows it)."""

    def __init__(self, stage: int) -> None:
        from perseus.runtime.job import RecordingListener

        self._orders = RecordingListener()
        self._pad_s = {"forward": 0.010 * (1 + 0.5 * stage), "backward": 0.030 * (1 + 0.5 * stage)}
        self.times: list[list[list[float]]] = []

    @property
    def steps(self) -> list:
        return self._orders.steps

    def on_step_begin(self) -> None:
        self._orders.on_step_begin()
        self.times.append([])

    def on_step_end(self) -> None:
        self._orders.on_step_end()

    def on_instruction_begin(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
        self._orders.on_instruction_begin(kind, microbatch, chunk)
        self.times[-1].append([time.perf_counter(), 0.0])

    def on_instruction_end(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
        time.sleep(self._pad_s[kind])
        self._orders.on_instruction_end(kind, microbatch, chunk)
        self.times[-1][-1][1] = time.perf_counter()


def run_enable(stages: int, out: Path) -> dict[str, Any]:
    """enable() with the real runtime (simulated GPU, measure-only): the job it builds and its steps."""
    import perseus_megatron
    from perseus.runtime.job import RecordingListener
    from perseus_demo.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel

    rank = int(os.environ["RANK"])
    os.environ.setdefault("PERSEUS_SIM_GPU_DIR", str(out / "sim-gpus"))
    initialize_parallel(stages, 2)
    trainer = TinyGPTTrainer(TinyGPTShape(num_layers=stages * 2), stages, 2)
    seen: list[Any] = []

    class Tee(RecordingListener):
        def __init__(self, runtime: Any) -> None:
            super().__init__()
            self.runtime = runtime
            seen.append(self)

        def on_step_begin(self) -> None:
            super().on_step_begin()
            self.runtime.on_step_begin()

        def on_step_end(self) -> None:
            self.runtime.on_step_end()

        def on_instruction_begin(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
            super().on_instruction_begin(kind, microbatch, chunk)
            self.runtime.on_instruction_begin(kind, microbatch, chunk)

        def on_instruction_end(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
            self.runtime.on_instruction_end(kind, microbatch, chunk)
            super().on_instruction_end(kind, microbatch, chunk)

    handle = perseus_megatron.enable(
        gpu="sim", device_index=rank, mode="measure-only", warmup_steps=1, cache_dir=None, listener_wrapper=Tee
    )
    try:
        for _ in range(2):
            trainer.step(4)
        trainer.step(4, forward_only=True)
        trainer.step(6)  # microbatch count changes: a new runtime for the new job shape
        job = handle.job
        summary = handle.summary()
    finally:
        handle.close()
    return {
        "job": {k: v for k, v in vars(job).items() if k not in ("model_config", "stage_fingerprint")},
        "model_config": dict(job.model_config),
        "stage_fingerprint": job.stage_fingerprint,
        "runtimes_created": len(seen),
        "steps_per_listener": [len(t.steps) for t in seen],
        "last_steps": [[[i.kind, i.microbatch, i.chunk] for i in step] for step in seen[-1].steps],
        "summary_steps": summary.get("steps"),
        "hooks_removed": perseus_megatron.hooks.active_handle() is None,
        "parallel_state": where(),
    }


def any_rank_failed(failed: bool) -> bool:
    """True on every rank when a case failed on any (all ranks call it together)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(failed)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> None:
    from perseus_demo.megatron_cpu import cpu_execution

    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    specs = [spec for spec in sys.argv[2:] if not spec.startswith("demo:")]
    demos = [Path(spec.split(":", 1)[1]) for spec in sys.argv[2:] if spec.startswith("demo:")]
    result: dict[str, Any] = {}
    try:
        with cpu_execution():
            for spec in specs:
                if spec.startswith("enable:"):
                    result["enable"] = run_enable(int(spec.split(":")[1]), out)
                else:
                    result[spec.split(":")[0]] = run_case(spec)
    except BaseException:  # noqa: BLE001 - the test reads the traceback from the result file
        result["error"] = traceback.format_exc()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    if not demos or any_rank_failed("error" in result):
        return
    from perseus_demo.megatron_demo import DemoConfig, run_rank

    for demo in demos:  # a failure here is the demo's: no rank<R>.json in its folder, the traceback on stderr
        run_rank(DemoConfig(**json.loads((demo / "config.json").read_text())), demo)


if __name__ == "__main__":
    main()
