"""One torchrun rank of a 2-stage DeepSpeed pipeline on CPU: the cache entry rank 0 opens for
several models, written to rank<N>.json.

Run by test_deepspeed_cache_key.py's distributed test as
``torchrun --standalone --nproc_per_node=2 deepspeed_cache_key_worker.py OUT_DIR``. Each model
is started with ``perseus_deepspeed.initialize`` (the real runtime: simulated GPU, measure-only,
a cache directory) and destroyed again; no training step runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HIDDEN = 16
MODELS = ("base", "base again", "partition", "stage 1 dtype")


def build(name: str, stage: int):
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(1 if name == "base again" else 0)
    layers = [LayerSpec(torch.nn.Linear, HIDDEN, 4 * HIDDEN), LayerSpec(torch.nn.Linear, 4 * HIDDEN, HIDDEN)]
    layers += [LayerSpec(torch.nn.ReLU) for _ in range(3)] + [LayerSpec(torch.nn.Linear, HIDDEN, HIDDEN)]
    method = "parameters" if name == "partition" else "uniform"
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method=method)
    if name == "stage 1 dtype" and stage == 1:
        model.double()  # only stage 1's ranks see it: the layer specs are the same everywhere
    return model


def main(out_dir: Path) -> None:
    from perseus_deepspeed import get_handle, initialize
    from perseus_demo.deepspeed_cpu import init_cpu_distributed
    from perseus_demo.tiny_pipe import TinyPipeShape, client_optimizer, deepspeed_config

    init_cpu_distributed()
    rank = int(os.environ["RANK"])
    section = {"gpu": "sim", "mode": "measure-only", "cache_dir": str(out_dir / "cache"), "log_every_steps": 0,
               "straggler_period_steps": 0}
    result: dict = {"rank": rank, "entries": {}, "partition": {}}
    for name in MODELS:
        model = build(name, rank)
        config = deepspeed_config(2, TinyPipeShape(HIDDEN, 1, 2), section)
        engine, *_ = initialize(model=model, optimizer=client_optimizer(model), config=config)
        handle = get_handle(engine)
        cache = handle.runtime.cache
        result["entries"][name] = cache.dir.name if cache is not None else None
        result["partition"][name] = handle.job.model_config["partition"]
        engine.destroy()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
