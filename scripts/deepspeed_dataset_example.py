"""A DeepSpeed pipeline script in the style of DeepSpeed's own examples, with Perseus added.

Everything DeepSpeed-specific comes from DeepSpeed, as in DeepSpeedExamples' pipeline scripts:

- the config is a file named by ``--deepspeed_config`` (``deepspeed.add_config_arguments``);
- DeepSpeed builds the optimizer and the LR scheduler from the config's ``"optimizer"`` and
  ``"scheduler"`` sections (no client optimizer);
- the dataset goes to ``initialize(training_data=...)``; the ``PipelineEngine`` wraps it in its
  own loader, and ``engine.train_batch()`` without an iterator reads from that loader.

Perseus changes one line (``deepspeed.initialize`` -> ``perseus_deepspeed.initialize``, marked
"Perseus:") and reads the ``"perseus"`` section of the same config.

GPUs:

    deepspeed --num_gpus 4 scripts/deepspeed_dataset_example.py \\
        --deepspeed_config scripts/deepspeed_config_dataset_example.json -p 4 --steps 200

CPU only, to try it out (gloo, simulated GPUs, no DeepSpeed op compilation):

    deepspeed --num_gpus 2 scripts/deepspeed_dataset_example.py \\
        --deepspeed_config scripts/deepspeed_config_dataset_example.json -p 2 --steps 10 --cpu

The example config sets ``"torch_adam": true`` so that DeepSpeed's ``Adam`` is
``torch.optim.AdamW``, which needs no compiled op on CPU; on GPUs, drop it to get FusedAdam.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "--cpu" in sys.argv:  # DeepSpeed picks its accelerator when it is imported
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("PERSEUS_GPU", "sim")

import deepspeed
import torch
from deepspeed.pipe import LayerSpec, PipelineModule

import perseus_deepspeed  # (Perseus)


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DeepSpeed pipeline training with Perseus (DeepSpeedExamples style)")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2, help="pipeline stages")
    parser.add_argument("-s", "--steps", type=int, default=100, help="train_batch calls")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16, help="Linear+GELU blocks, split over the stages")
    parser.add_argument("--samples", type=int, default=4096, help="dataset size (the engine's loader repeats it)")
    parser.add_argument("--seed", type=int, default=1138)
    parser.add_argument("--cpu", action="store_true", help="run on CPU with gloo and simulated GPUs")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def regression_dataset(args: argparse.Namespace) -> torch.utils.data.Dataset:
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, args.hidden_size, generator=generator)
    return torch.utils.data.TensorDataset(x, torch.tanh(x))


def pipeline_model(args: argparse.Namespace) -> PipelineModule:
    layers = []
    for _ in range(args.layers):
        layers += [LayerSpec(torch.nn.Linear, args.hidden_size, args.hidden_size), LayerSpec(torch.nn.GELU)]
    return PipelineModule(layers=layers, num_stages=args.pipeline_parallel_size, loss_fn=torch.nn.MSELoss(),
                          partition_method="parameters", activation_checkpoint_interval=0)


def main() -> None:
    args = get_args()
    if args.cpu:
        from perseus_demo.deepspeed_cpu import init_cpu_distributed

        init_cpu_distributed()  # gloo, and no 2-minute shm op compile
    else:
        deepspeed.init_distributed()
    torch.manual_seed(args.seed)

    net = pipeline_model(args)
    trainset = regression_dataset(args)
    # Perseus: the drop-in for deepspeed.initialize (same arguments, same return value).
    engine, _, _, _ = perseus_deepspeed.initialize(
        args=args, model=net, model_parameters=[p for p in net.parameters() if p.requires_grad], training_data=trainset)

    for step in range(args.steps):
        loss = engine.train_batch()  # the next gradient_accumulation_steps micro-batches of the engine's loader
        if engine.global_rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e}")

    # Perseus: measured results of this rank (baseline vs current iteration time and energy).
    handle = perseus_deepspeed.get_handle(engine)
    if handle is not None and engine.global_rank == 0:
        summary = handle.summary()
        print("perseus summary:", json.dumps({k: summary.get(k) for k in ("phase", "steps", "baseline", "current")}))
    engine.destroy()  # Perseus restores default clocks here (and at exit)


if __name__ == "__main__":
    main()
