"""One torchrun rank of a real DeepSpeed pipeline on CPU: records what Perseus sees, writes rank<N>.json.

Run by test_deepspeed_orders_distributed.py as
``torchrun --standalone --nproc_per_node=S deepspeed_orders_worker.py OUT_DIR MICROBATCHES``.
Perseus is started with ``perseus_deepspeed.initialize`` from the config's ``"perseus"`` section
(simulated GPU, measure-only); a tee records every event before it reaches the runtime.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


class Tee:
    """Delivers every event to a recorder, then to the runtime."""

    def __init__(self, recorder, runtime):
        self.recorder, self.runtime = recorder, runtime

    def on_step_begin(self):
        self.recorder.on_step_begin()
        self.runtime.on_step_begin()

    def on_step_end(self):
        self.recorder.on_step_end()
        self.runtime.on_step_end()

    def on_instruction_begin(self, kind, microbatch, chunk=0):
        self.recorder.on_instruction_begin(kind, microbatch, chunk)
        self.runtime.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind, microbatch, chunk=0):
        self.recorder.on_instruction_end(kind, microbatch, chunk)
        self.runtime.on_instruction_end(kind, microbatch, chunk)


def main(out_dir: Path, microbatches: int) -> None:
    from perseus.runtime.job import RecordingListener
    from perseus_deepspeed import get_handle, initialize
    from perseus_demo.deepspeed_cpu import init_cpu_distributed
    from perseus_demo.tiny_pipe import TinyPipeShape, build_pipeline, client_optimizer, data_iterator, deepspeed_config

    init_cpu_distributed()
    import deepspeed.comm.comm as ds_comm

    stages = int(os.environ["WORLD_SIZE"])
    shape = TinyPipeShape(hidden_size=16, layers_per_stage=1, micro_batch_size=2)
    perseus = {"gpu": "sim", "mode": "measure-only", "cache_dir": None, "warmup_steps": 1, "log_every_steps": 0,
               "straggler_period_steps": 0}
    model = build_pipeline(stages, shape, activation_checkpoint_interval=1)
    recorder = RecordingListener()
    engine, *_ = initialize(model=model, optimizer=client_optimizer(model),
                            config=deepspeed_config(microbatches, shape, perseus),
                            listener_wrapper=lambda runtime: Tee(recorder, runtime))
    handle = get_handle(engine)
    data = data_iterator(shape)
    engine.train_batch(data)
    engine.eval_batch(data_iterator(shape, seed=1))
    engine.train_batch(data)
    engine.train_batch(data)
    summary = handle.summary()
    engine.destroy()
    result = {
        "rank": int(os.environ["RANK"]),
        "job": {k: v for k, v in vars(handle.job).items() if k not in ("model_config", "stage_fingerprint")},
        "model_config": dict(handle.job.model_config),
        "stage_fingerprint": handle.job.stage_fingerprint,
        "device_index": handle.runtime.gpu.device.index,  # the runtime defaults a simulated GPU to the rank
        "orders": [[[i.kind, i.microbatch, i.chunk] for i in step] for step in recorder.steps],
        "runtime_steps": summary["steps"],
        "closed_by_destroy": handle.closed,
        "shm_op": ds_comm.cdb.shm_comm_op is not None,
    }
    (out_dir / f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
