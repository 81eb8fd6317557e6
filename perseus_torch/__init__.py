"""Perseus for torch.distributed.pipelining (and TorchTitan, which trains through it).

``perseus_torch.enable(schedule, stages, config)`` after building the schedule, on every rank;
``install_hooks(schedule, listener)`` is the bare event source. Supported: ``Schedule1F1B``,
``ScheduleGPipe``, ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` and
``ScheduleZBVZeroBubble``. See docs/torch-pipelining.md. TorchTitan's own trainer and job config:
``perseus_torch.torchtitan`` (which imports TorchTitan, so it is not imported here).

Importing this package does not import torch; the functions do when called.
"""

from perseus_torch.compat import SCHEDULE_NAMES, TESTED_VERSIONS, UnsupportedTorchSchedule, chunk_map, schedule_name
from perseus_torch.hooks import HookHandle, HooksAlreadyInstalled, install_hooks, installed_handle
from perseus_torch.integration import TorchPerseus, enable, job_from_schedule
from perseus_torch.tracker import HookStateError, PipelineTracker

__all__ = [
    "SCHEDULE_NAMES",
    "TESTED_VERSIONS",
    "HookHandle",
    "HookStateError",
    "HooksAlreadyInstalled",
    "PipelineTracker",
    "TorchPerseus",
    "UnsupportedTorchSchedule",
    "chunk_map",
    "enable",
    "install_hooks",
    "installed_handle",
    "job_from_schedule",
    "schedule_name",
]
