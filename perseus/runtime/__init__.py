"""Framework-neutral runtime: what the Megatron and DeepSpeed adapters drive."""

from perseus.runtime.events import InstructionListener, PipelineJob, RecordingListener

__all__ = ["InstructionListener", "PipelineJob", "RecordingListener"]
