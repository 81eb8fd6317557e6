"""Perseus for DeepSpeed pipeline parallelism (``PipelineEngine``, ``TrainSchedule``).

``perseus_deepspeed.initialize(...)`` replaces ``deepspeed.initialize(...)``; the ``"perseus"``
section of the DeepSpeed config configures it. ``install_hooks(engine, listener)`` is the bare
event source (any ``InstructionListener``). See docs/deepspeed.md.

Importing this package does not import DeepSpeed or torch; the functions do when called.
"""

from perseus_deepspeed.compat import (
    TESTED_VERSIONS,
    DeepSpeedVersionError,
    UnsupportedDeepSpeedFeature,
)
from perseus_deepspeed.hooks import HookHandle, HooksAlreadyInstalled, ScheduleMismatch, install_hooks, installed_handle
from perseus_deepspeed.integration import DeepSpeedPerseus, attach, get_handle, initialize
from perseus_deepspeed.job import job_from_engine, perseus_section

__all__ = [
    "TESTED_VERSIONS",
    "DeepSpeedPerseus",
    "DeepSpeedVersionError",
    "HookHandle",
    "HooksAlreadyInstalled",
    "ScheduleMismatch",
    "UnsupportedDeepSpeedFeature",
    "attach",
    "get_handle",
    "initialize",
    "install_hooks",
    "installed_handle",
    "job_from_engine",
    "perseus_section",
]
