"""A tiny DeepSpeed pipeline (Linear layers) for CPU tests, the demo and the example script.

A client optimizer (``torch.optim.SGD``) is passed to ``deepspeed.initialize`` so DeepSpeed does
not build its fused/CPU Adam extension; the config has no ``optimizer`` section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class TinyPipeShape:
    """Size of the model and of each microbatch."""

    hidden_size: int = 32
    layers_per_stage: int = 2
    micro_batch_size: int = 4


def deepspeed_config(num_microbatches: int, shape: TinyPipeShape, perseus: dict[str, Any] | None = None,
                     dp_size: int = 1) -> dict[str, Any]:
    """A DeepSpeed config for CPU pipeline training, with an optional ``"perseus"`` section."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": shape.micro_batch_size,
        "gradient_accumulation_steps": num_microbatches,
        "train_batch_size": shape.micro_batch_size * num_microbatches * dp_size,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if perseus is not None:
        config["perseus"] = perseus
    return config


def build_pipeline(num_stages: int, shape: TinyPipeShape, seed: int = 0, activation_checkpoint_interval: int = 0) -> Any:
    """A ``PipelineModule`` of ``num_stages × layers_per_stage`` Linear+ReLU layers, uniformly partitioned.

    ``activation_checkpoint_interval > 0`` recomputes forwards inside the backward pass, as
    DeepSpeed does for large models; the instruction order is unchanged.
    """
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(seed)
    layers = []
    for _ in range(num_stages * shape.layers_per_stage):
        layers.append(LayerSpec(torch.nn.Linear, shape.hidden_size, shape.hidden_size))
        layers.append(LayerSpec(torch.nn.ReLU))
    return PipelineModule(
        layers=layers, num_stages=num_stages, loss_fn=torch.nn.MSELoss(), partition_method="uniform",
        activation_checkpoint_interval=activation_checkpoint_interval,
    )


def data_iterator(shape: TinyPipeShape, seed: int = 0) -> Iterator[tuple[Any, Any]]:
    """Endless (input, target) microbatches; first and last stages each draw the same sequence."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(shape.micro_batch_size, shape.hidden_size, generator=generator)
        yield x, x.flip(-1) * 0.5


def client_optimizer(model: Any) -> Any:
    """Plain SGD: no DeepSpeed optimizer extension to compile."""
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01)
