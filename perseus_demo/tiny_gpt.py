"""A tiny megatron-core GPT pipeline that trains on CPU: the model, synthetic data, one train step.

Used by the adapter tests (real schedules, recorded orders) and the demo. Everything is real
megatron-core — ``GPTModel`` with the local layer spec, ``get_forward_backward_func`` and its
p2p communication — only sized so that a 4-stage pipeline trains in seconds on a laptop CPU.
Call these inside :func:`perseus_demo.megatron_cpu.cpu_execution` after ``init_cpu_distributed()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch


@dataclass(frozen=True)
class TinyGPTShape:
    """Model and batch sizes; ``num_layers`` must divide evenly over stages × chunks."""

    num_layers: int = 4
    hidden_size: int = 32
    num_attention_heads: int = 4
    vocab_size: int = 128
    seq_length: int = 16
    micro_batch_size: int = 2
    # mixture of experts: 0 is a dense MLP; otherwise this many experts per MoE layer, top-2
    # routing, megatron-core's alltoall dispatcher over ``expert_parallel`` ranks (run inside
    # ``megatron_cpu.moe_cpu_execution``)
    num_experts: int = 0
    expert_parallel: int = 1


def initialize_parallel(pipeline_size: int, virtual_chunks: int | None = None, seed: int = 1234,
                        expert_parallel: int = 1) -> None:
    """megatron-core parallel state on the gloo world: TP = 1, DP = world size / pipeline size, and
    ``expert_parallel`` ranks of each stage's data-parallel group sharing its experts."""
    from megatron.core import parallel_state

    from perseus_demo.megatron_cpu import init_cpu_distributed, init_cpu_rng

    init_cpu_distributed()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=pipeline_size,
        virtual_pipeline_model_parallel_size=virtual_chunks,
        expert_model_parallel_size=expert_parallel,
    )
    init_cpu_rng(seed)


def transformer_config(shape: TinyGPTShape, pipeline_size: int, virtual_chunks: int | None = None,
                       group_size: int | None = None) -> Any:
    """A ``TransformerConfig`` that runs on CPU: CPU init, fp32, no dropout, no fused kernels.

    ``group_size``: megatron-core's ``microbatch_group_size_per_vp_stage`` (None: its default).
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra: dict[str, Any] = {} if group_size is None else {"microbatch_group_size_per_vp_stage": group_size}
    if shape.num_experts:
        extra.update(num_moe_experts=shape.num_experts, moe_router_topk=2, expert_model_parallel_size=shape.expert_parallel,
                     moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, moe_aux_loss_coeff=0.0)
    return TransformerConfig(
        **extra,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        pipeline_model_parallel_size=pipeline_size,
        virtual_pipeline_model_parallel_size=virtual_chunks,
        pipeline_dtype=torch.float32,
        params_dtype=torch.float32,
        cuda_graph_scope=None,  # default "full" only warns; no CUDA graphs on CPU
    )


def build_model_chunks(shape: TinyGPTShape, config: Any) -> list[torch.nn.Module]:
    """This rank's model chunks (one per virtual pipeline stage), as megatron-core lays them out."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    chunks = config.virtual_pipeline_model_parallel_size or 1
    models: list[torch.nn.Module] = []
    for vp_stage in range(chunks):
        vp = vp_stage if chunks > 1 else None
        models.append(
            GPTModel(
                config=config,
                transformer_layer_spec=get_gpt_layer_local_spec(num_experts=shape.num_experts or None,
                                                                moe_grouped_gemm=False),
                vocab_size=shape.vocab_size,
                max_sequence_length=shape.seq_length,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=False,
                vp_stage=vp,
            )
        )
    return models


def synthetic_batches(shape: TinyGPTShape, seed: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Endless random token microbatches (labels = next token); identical on every rank."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(shape.seq_length).unsqueeze(0).expand(shape.micro_batch_size, -1)
    while True:
        tokens = torch.randint(0, shape.vocab_size, (shape.micro_batch_size, shape.seq_length + 1), generator=generator)
        yield {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(), "position_ids": positions}


def _loss(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = output.float().mean()
    return loss, {"lm loss": loss.detach()}


def forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module) -> tuple[Any, Callable]:
    """megatron-core ``forward_step_func``: every stage draws its microbatch so data stays aligned."""
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, _loss


class TinyGPTTrainer:
    """Owns the model chunks, optimizer and data of one rank; ``step()`` runs one training iteration."""

    def __init__(self, shape: TinyGPTShape, pipeline_size: int, virtual_chunks: int | None = None, lr: float = 1e-3,
                 group_size: int | None = None):
        self.shape = shape
        self.config = transformer_config(shape, pipeline_size, virtual_chunks, group_size)
        self.model = build_model_chunks(shape, self.config)
        params = [p for chunk in self.model for p in chunk.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=lr)
        self.data = [synthetic_batches(shape) for _ in self.model]

    def step(self, num_microbatches: int, forward_only: bool = False) -> list[dict[str, torch.Tensor]]:
        """One iteration: forward-backward through megatron-core's schedule, then the optimizer."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        forward_backward = get_forward_backward_func()
        for chunk in self.model:
            chunk.zero_grad(set_to_none=True)
        interleaved = len(self.model) > 1
        losses = forward_backward(
            forward_step_func=forward_step,
            data_iterator=self.data if interleaved else self.data[0],
            model=self.model if interleaved else self.model[0],
            num_microbatches=num_microbatches,
            seq_length=self.shape.seq_length,
            micro_batch_size=self.shape.micro_batch_size,
            forward_only=forward_only,
        )
        if not forward_only:
            self._sync_gradients()
            self.optimizer.step()
        return losses

    def _sync_gradients(self) -> None:
        """Average gradients over the data-parallel group, as Megatron's DDP does after the schedule.

        This is what couples data-parallel pipelines: each waits here for the slowest one.
        (megatron-core's own DistributedDataParallel allocates its buffers on CUDA.)
        """
        import torch.distributed as dist
        from megatron.core import parallel_state

        dense = (parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_group())
        experts = dense
        if self.shape.num_experts:  # each rank's experts are its own; replicas of them are the expert-DP group
            experts = (parallel_state.get_expert_data_parallel_world_size(), parallel_state.get_expert_data_parallel_group())
        for chunk in self.model:
            for param in chunk.parameters():
                size, group = dense if getattr(param, "allreduce", True) else experts
                if param.grad is not None and size > 1:
                    dist.all_reduce(param.grad, group=group)
                    param.grad.div_(size)
