"""Framework-neutral runtime: what the Megatron and DeepSpeed adapters drive.

``PerseusRuntime`` is imported lazily: it pulls in torch.distributed, which code that only needs
the event vocabulary or the configuration (CLI, planners, adapter tests) should not pay for.
"""

from typing import TYPE_CHECKING, Any

from perseus.runtime.attachment import Attachment, entry_point_hooks
from perseus.runtime.config import DESIGNS, GPU_BACKENDS, MODES, ControlPlaneDesign, Mode, PerseusConfig, choices
from perseus.runtime.errors import HookStateError, HooksAlreadyInstalled
from perseus.runtime.job import InstructionListener, PipelineJob, RecordingListener
from perseus.runtime.supply.fingerprint import describe_value, stage_fingerprint, value_digest
from perseus.runtime.observe.metrics import EventListSink, MetricsSink, ScalarWriterSink, StepMetrics, WandbSink
from perseus.runtime.lifecycle import install_process_hooks
from perseus.runtime.phases import Phase

if TYPE_CHECKING:
    from perseus.runtime.engine import PerseusRuntime

__all__ = ["DESIGNS", "GPU_BACKENDS", "MODES", "Attachment", "ControlPlaneDesign", "EventListSink", "HookStateError",
           "HooksAlreadyInstalled", "InstructionListener", "MetricsSink", "Mode", "PerseusConfig", "PerseusRuntime",
           "Phase", "PipelineJob", "RecordingListener", "ScalarWriterSink", "StepMetrics", "WandbSink", "choices",
           "describe_value", "entry_point_hooks", "install_process_hooks", "stage_fingerprint", "value_digest"]


def __getattr__(name: str) -> Any:
    if name == "PerseusRuntime":
        from perseus.runtime.engine import PerseusRuntime

        return PerseusRuntime
    raise AttributeError(f"module 'perseus.runtime' has no attribute {name!r}")
