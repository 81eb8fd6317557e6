"""An unpadded DeepSpeed pipeline training script, shaped like DeepSpeedExamples'
``training/pipeline_parallelism/train.py``, with the two documented Perseus lines.

What is the upstream example's: an AlexNet-style CNN flattened into a ``PipelineModule`` by
``join_layers`` (features, pooling, flatten, classifier), cross-entropy loss,
``partition_method="parameters"``, ``deepspeed.initialize(args=..., model=..., model_parameters=...,
training_data=...)`` and ``engine.train_batch()`` reading from the engine's own loader, the config
from ``--deepspeed_config``. What differs, for CPU: random images and labels instead of CIFAR-10
(no download), gloo (``init_cpu_distributed``), a narrower AlexNet for 32×32 inputs so a step
takes a fraction of a second on two busy cores. Nothing is padded: every instruction takes as long
as its real torch compute (and, on the simulated GPU, the stretch its clock adds).

Perseus lines (marked "Perseus:"): ``import perseus_deepspeed`` and ``perseus_deepspeed.initialize``
in place of ``deepspeed.initialize``; the settings come from the config's ``"perseus"`` section.

    torchrun --standalone --nproc_per_node 2 tests/deepspeed/alexnet_pipe_train.py \\
        --deepspeed_config CONFIG.json --steps 20

(``PERSEUS_GPU=sim`` and ``DS_ACCELERATOR=cpu`` are set here when ``--cpu`` is given.)
"""

from __future__ import annotations

import argparse
import os
import sys

if "--cpu" in sys.argv:  # DeepSpeed picks its accelerator when it is imported
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("PERSEUS_GPU", "sim")

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from torch import nn

import perseus_deepspeed  # Perseus


class AlexNet(nn.Module):
    """DeepSpeedExamples' CIFAR AlexNet layout (5 convolutions, 3 pools, 3-layer classifier), narrowed by ``width``."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(3, w, kernel_size=3, stride=1, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(w, 3 * w, kernel_size=3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(3 * w, 6 * w, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(6 * w, 4 * w, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(4 * w, 4 * w, kernel_size=3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(4 * w * 2 * 2, 16 * w), nn.ReLU(inplace=True),
            nn.Dropout(), nn.Linear(16 * w, 16 * w), nn.ReLU(inplace=True),
            nn.Linear(16 * w, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def join_layers(vision_model: AlexNet) -> list:
    """As upstream: the model's layers as one flat list for ``PipelineModule``."""
    return [*vision_model.features, vision_model.avgpool, lambda x: torch.flatten(x, 1), *vision_model.classifier]


def random_images(samples: int, num_classes: int, seed: int) -> torch.utils.data.Dataset:
    """Stands in for CIFAR-10: 3×32×32 images and integer labels."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 3, 32, 32, generator=generator)
    labels = torch.randint(0, num_classes, (samples,), generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="AlexNet pipeline training (DeepSpeedExamples style) with Perseus")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2)
    parser.add_argument("-s", "--steps", type=int, default=100)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1138)
    parser.add_argument("--cpu", action="store_true", help="gloo and simulated GPUs")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = get_args()
    if args.cpu:
        from perseus_demo.deepspeed_cpu import init_cpu_distributed

        init_cpu_distributed()
    else:
        deepspeed.init_distributed()
    torch.manual_seed(args.seed)
    deepspeed.runtime.utils.set_random_seed(args.seed)

    net = PipelineModule(layers=join_layers(AlexNet(num_classes=args.num_classes, width=args.width)),
                         loss_fn=nn.CrossEntropyLoss(), num_stages=args.pipeline_parallel_size,
                         partition_method="parameters", activation_checkpoint_interval=0)
    trainset = random_images(args.samples, args.num_classes, args.seed)
    # Perseus: the drop-in for deepspeed.initialize.
    engine, _, _, _ = perseus_deepspeed.initialize(
        args=args, model=net, model_parameters=[p for p in net.parameters() if p.requires_grad], training_data=trainset)
    for step in range(args.steps):
        loss = engine.train_batch()
        if engine.global_rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
