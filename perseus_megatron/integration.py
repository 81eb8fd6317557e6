"""``perseus_megatron.enable()``: the one-line change for custom megatron-core training scripts.

The runtime needs the job's shape — pipeline stage, data/tensor-parallel position, schedule,
virtual chunks and the number of microbatches. The first four come from megatron-core's
``parallel_state``, the microbatch count only from the schedule call itself, so the runtime is
created at the first training step, on every rank at the same step.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Mapping, Sequence

from perseus import versions
from perseus.errors import ConfigError, PerseusError
from perseus.runtime import (Attachment, InstructionListener, PerseusConfig, PipelineJob, describe_value,
                             entry_point_hooks)
from perseus_megatron.hooks import install_hooks
from perseus_megatron.observability import MegatronWritersSink, add_to_iteration_log
from perseus_megatron.tracker import StepInfo

log = logging.getLogger("perseus.megatron")

ListenerWrapper = Callable[[InstructionListener], InstructionListener]
RuntimeFactory = Callable[..., Any]

# TransformerConfig (and ModelParallelConfig) fields that change per-instruction time and energy or
# the schedule: they key the runtime's cache (docs/megatron.md lists them). A field a megatron-core
# line does not have is left out. Shapes the config does not hold (vocabulary, embeddings) are in
# each rank's parameters (StepInfo.stage_fingerprint).
_FINGERPRINT_FIELDS = (
    # model shape
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "gated_linear_unit", "activation_func", "normalization", "add_bias_linear", "add_qkv_bias", "qk_layernorm",
    "multi_latent_attention", "window_size", "attention_backend", "mtp_num_layers", "hidden_dropout",
    "attention_dropout",
    # dtype
    "params_dtype", "pipeline_dtype", "fp16", "bf16", "fp8", "fp8_recipe", "fp8_param", "fp4",
    # parallelism (TP/PP/VP/CP/EP) and how layers are split over stages
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "pipeline_model_parallel_layout",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    # recomputation and offloading
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "distribute_saved_activations", "cpu_offloading",
    # mixture of experts
    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_grouped_gemm", "moe_token_dispatcher_type", "moe_router_load_balancing_type",
    "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    # kernels and overlap that change an instruction's work
    "bias_activation_fusion", "masked_softmax_fusion", "bias_dropout_fusion", "apply_rope_fusion",
    "gradient_accumulation_fusion", "tp_comm_overlap", "deallocate_pipeline_outputs", "variable_seq_lengths",
    # combined 1F1B: weight gradients delayed inside each fused unit
    "delay_wgrad_compute",
)


class MegatronJobError(PerseusError):
    """megatron-core's parallel state does not describe a job Perseus can plan."""


def model_fingerprint(info: StepInfo) -> dict[str, Any]:
    """What, besides the schedule, determines this job's profile (hashed into the cache key): the
    call's sequence length and micro-batch size and the model config's ``_FINGERPRINT_FIELDS``."""
    config = info.model_config
    out: dict[str, Any] = {"framework": "megatron-core", "seq_length": info.seq_length,
                           "micro_batch_size": info.micro_batch_size}
    for name in _FINGERPRINT_FIELDS:
        value = getattr(config, name, None)
        if value is not None:
            out[name] = describe_value(value)
    return out


def job_from_parallel_state(info: StepInfo) -> PipelineJob:
    """This rank's ``PipelineJob`` from megatron-core's ``parallel_state`` and one schedule call.

    Tensor- and context-parallel ranks of a stage work in lockstep on the same instructions, so
    together they form the job's ``tp`` group (size TP × CP); data-parallel replicas are ``dp``.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        raise MegatronJobError("megatron-core parallel state is not initialized; call "
                               "parallel_state.initialize_model_parallel(...) before training")
    stages = ps.get_pipeline_model_parallel_world_size()
    # megatron-core's microbatch_group_size_per_vp_stage changes the interleaved order (perseus.schedules
    # builds it for any group size, checked against megatron's own order oracle); the default (the
    # pipeline size) is recorded as None so that default jobs keep their cache keys and files.
    interleaved = info.schedule in ("interleaved", "megatron-combined-1f1b")
    group = info.group_size if interleaved and info.group_size != stages else None
    tp, cp = ps.get_tensor_model_parallel_world_size(), ps.get_context_parallel_world_size()
    return PipelineJob(
        num_stages=stages,
        num_microbatches=info.num_microbatches,
        stage=ps.get_pipeline_model_parallel_rank(),
        schedule=info.schedule,
        num_chunks=info.num_chunks,
        group_size=group,
        overlap_p2p=info.overlap_p2p,
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=ps.get_data_parallel_world_size(),
        tp_rank=ps.get_context_parallel_rank() * tp + ps.get_tensor_model_parallel_rank(),
        tp_size=tp * cp,
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
        model_config=model_fingerprint(info),
        stage_fingerprint=info.stage_fingerprint,
    )


def _close_without_waiting(runtime: Any) -> None:
    """A mid-training restart (batch-size ramp-up) stops a planning run at once: a frontier for the
    old shape is not worth stalling training for (``close_plan_wait_s`` is for the run's end)."""
    close = runtime.close
    if "plan_wait_s" in inspect.signature(close).parameters:
        close(plan_wait_s=0.0)
    else:  # a runtime factory's own object
        close()


def _default_runtime_factory() -> RuntimeFactory:
    from perseus.runtime import PerseusRuntime

    return PerseusRuntime


class MegatronPerseus(Attachment):
    """What :func:`enable` returns: the installed hooks and the runtime they drive (created at the
    first training step, when the pipeline's shape is known)."""

    def __init__(
        self,
        config: PerseusConfig,
        *,
        process_group: Any = None,
        listener_wrapper: ListenerWrapper | None = None,
        runtime_factory: RuntimeFactory | None = None,
        job_builder: Callable[[StepInfo], PipelineJob] = job_from_parallel_state,
    ) -> None:
        super().__init__(config)
        self._process_group = process_group
        self._wrap = listener_wrapper
        self._factory = runtime_factory
        self._job_builder = job_builder
        self._listener: InstructionListener | None = None
        self._logging_iterations = False

    def _listener_for_step(self, info: StepInfo) -> InstructionListener:
        job = self._job_builder(info)
        if self.runtime is not None and job != self.job:
            log.warning(
                "perseus: the pipeline job changed (%s x %d microbatches -> %s x %d); restarting the Perseus runtime "
                "for the new shape", self.job.schedule if self.job else "?", self.job.num_microbatches if self.job else 0,
                job.schedule, job.num_microbatches,
            )
            _close_without_waiting(self.runtime)
            self.runtime = None
        if self.runtime is None:
            factory = self._factory or _default_runtime_factory()
            self.runtime = factory(job, self.config, process_group=self._process_group)
            self.job = job
            add_sink = getattr(self.runtime, "add_metrics_sink", None)
            if callable(add_sink):  # Megatron-LM's TensorBoard/wandb writers, when it has them
                add_sink(MegatronWritersSink())
            self._listener = self._wrap(self.runtime) if self._wrap is not None else self.runtime
        assert self._listener is not None
        return self._listener

    def add_to_iteration_log(self) -> bool:
        """Append Perseus's energy and saving to Megatron-LM's iteration log line (``training_log``);
        needs ``megatron.training`` already imported. True if installed (perseus_megatron/observability.py)."""
        if not self._logging_iterations and not self.closed and self.config.enabled:
            undo = add_to_iteration_log(self)
            if undo is not None:
                self.on_close(undo)
                self._logging_iterations = True
        return self._logging_iterations


def resolve_config(config: PerseusConfig | Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> PerseusConfig:
    """Config object, mapping or nothing, plus keyword overrides → one validated ``PerseusConfig``."""
    if config is None or isinstance(config, Mapping):
        return PerseusConfig.from_dict({**dict(config or {}), **overrides})
    if isinstance(config, PerseusConfig):
        return config.replace(**overrides) if overrides else config
    raise ConfigError(f"perseus_megatron.enable: config must be a PerseusConfig or a mapping, got {type(config).__name__}")


def enable(
    config: PerseusConfig | Mapping[str, Any] | None = None,
    *,
    process_group: Any = None,
    listener_wrapper: ListenerWrapper | None = None,
    runtime_factory: RuntimeFactory | None = None,
    **overrides: Any,
) -> MegatronPerseus:
    """Turn Perseus on for this process's megatron-core training; call once before training.

    ``enable(mode="profile", cache_dir="/ckpt/perseus")`` — overrides are ``PerseusConfig``
    fields. Call ``get_forward_backward_func()`` after this (Megatron-LM does so every step).
    The returned handle's ``close()`` removes the hooks and restores default clocks; it also
    runs at interpreter exit. ``listener_wrapper`` lets a caller interpose on the runtime's
    events (the demo times simulated GPU work with it).
    """
    resolved = resolve_config(config, overrides)
    handle = MegatronPerseus(
        resolved, process_group=process_group, listener_wrapper=listener_wrapper, runtime_factory=runtime_factory
    )
    if not resolved.enabled:
        log.info("perseus: disabled by configuration; training runs unchanged")
        return handle
    entry_point_hooks(resolved)
    versions.warn_unsupported(versions.MEGATRON, ("torch",))  # megatron-core: compat, with the hook points
    handle.hooks = install_hooks(listener_for_step=handle._listener_for_step)
    handle.on_close(handle.hooks.uninstall)
    handle.close_at_exit()
    return handle


def enable_from_argv(argv: Sequence[str] | None = None) -> MegatronPerseus | None:
    """``enable()`` if the command line has ``--perseus``; for scripts that parse arguments elsewhere.

    Reads only the ``--perseus*`` flags (Megatron-LM still needs ``add_perseus_args`` in its
    ``extra_args_provider`` so that it accepts them). Returns ``None`` when Perseus is off.
    """
    import sys

    from perseus_megatron.args import config_from_argv

    config = config_from_argv(sys.argv[1:] if argv is None else argv)
    return _with_iteration_log(enable(config)) if config.enabled else None


def _with_iteration_log(handle: MegatronPerseus) -> MegatronPerseus:
    """Megatron-LM entry points also extend its iteration log line (when its training loop is loaded)."""
    handle.add_to_iteration_log()
    return handle


def enable_from_args(args: Any) -> MegatronPerseus | None:
    """``enable()`` from Megatron-LM's parsed arguments (``add_perseus_args`` was in the parser).

    For core ≥ 0.18 scripts, between ``args = parse_and_validate_args(extra_args_provider=...)``
    and ``pretrain(full_config, ...)``. Returns ``None`` when ``--perseus`` was not given.
    """
    from perseus_megatron.args import config_from_args

    config = config_from_args(args)
    return _with_iteration_log(enable(config)) if config.enabled else None
