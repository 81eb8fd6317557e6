"""Train a DeepSpeed pipeline with Perseus: ``perseus_deepspeed.initialize`` instead of ``deepspeed.initialize``.

GPUs (one process per GPU, the "perseus" section of the config turns Perseus on):

    deepspeed --num_gpus 4 scripts/deepspeed_train_example.py \\
        --deepspeed_config scripts/deepspeed_config_example.json --stages 4 --steps 200

CPU only, to try it out (gloo, simulated GPUs, no DeepSpeed op compilation):

    deepspeed --num_gpus 2 scripts/deepspeed_train_example.py \\
        --deepspeed_config scripts/deepspeed_config_example.json --stages 2 --steps 10 --cpu

The only Perseus-specific lines are marked "Perseus:". With ``--cpu`` the example also sets
``DS_ACCELERATOR=cpu`` and ``PERSEUS_GPU=sim`` before DeepSpeed is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DeepSpeed pipeline training with Perseus")
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages (world size / stages = DP replicas)")
    parser.add_argument("--steps", type=int, default=20, help="training iterations (train_batch calls)")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16, help="Linear+GELU blocks, split evenly over the stages")
    parser.add_argument("--cpu", action="store_true", help="run on CPU with gloo and simulated GPUs")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    import deepspeed

    return deepspeed.add_config_arguments(parser).parse_args()


def build_model(args: argparse.Namespace):
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule

    layers = []
    for _ in range(args.layers):
        layers += [LayerSpec(torch.nn.Linear, args.hidden_size, args.hidden_size), LayerSpec(torch.nn.GELU)]
    return PipelineModule(layers=layers, num_stages=args.stages, loss_fn=torch.nn.MSELoss(),
                          partition_method="parameters")


def batches(args: argparse.Namespace, micro_batch_size: int):
    import torch

    generator = torch.Generator().manual_seed(1234)
    while True:
        x = torch.randn(micro_batch_size, args.hidden_size, generator=generator)
        yield x, torch.tanh(x)


def main() -> None:
    if "--cpu" in sys.argv:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("PERSEUS_GPU", "sim")
    args = parse_args()
    import deepspeed
    import torch

    import perseus_deepspeed

    if args.cpu:
        from perseus_demo.deepspeed_cpu import init_cpu_distributed

        init_cpu_distributed()  # gloo, and no 2-minute shm op compile
    else:
        deepspeed.init_distributed()
    model = build_model(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # a client optimizer: no DeepSpeed op to build
    # Perseus: the drop-in; reads the "perseus" section of --deepspeed_config.
    engine, _, _, _ = perseus_deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    data = batches(args, engine.train_micro_batch_size_per_gpu())
    for _ in range(args.steps):
        engine.train_batch(data)
    # Perseus: measured results of this rank (baseline vs current iteration time and energy).
    handle = perseus_deepspeed.get_handle(engine)
    if handle is not None and engine.global_rank == 0:
        summary = handle.summary()
        print("perseus summary:", json.dumps({k: summary.get(k) for k in ("phase", "steps", "baseline", "current")}))
    engine.destroy()  # Perseus restores default clocks here (and at exit)


if __name__ == "__main__":
    main()
