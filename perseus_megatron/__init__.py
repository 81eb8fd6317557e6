"""Perseus for Megatron-LM / megatron-core: schedule hooks, ``--perseus`` flags, ``enable()``.

Imports are lazy: megatron-core's schedules module (when patched) imports
``perseus_megatron.hooks`` while megatron itself is importing, so this package must not pull
in torch or Megatron at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "add_perseus_args": "perseus_megatron.args",
    "config_from_args": "perseus_megatron.args",
    "compose_providers": "perseus_megatron.args",
    "with_perseus_args": "perseus_megatron.args",
    "enable": "perseus_megatron.integration",
    "enable_from_argv": "perseus_megatron.integration",
    "enable_from_args": "perseus_megatron.integration",
    "accept_perseus_flags": "perseus_megatron.pretrain_gpt",
    "MegatronPerseus": "perseus_megatron.integration",
    "job_from_parallel_state": "perseus_megatron.integration",
    "install_hooks": "perseus_megatron.hooks",
    "HookHandle": "perseus_megatron.hooks",
    "HooksAlreadyInstalled": "perseus_megatron.hooks",
    "StepInfo": "perseus_megatron.tracker",
    "MegatronVersionError": "perseus_megatron.compat",
    "UnsupportedMegatronFeature": "perseus_megatron.compat",
    "TESTED_VERSIONS": "perseus_megatron.compat",
    "SUPPORTED_VERSIONS": "perseus_megatron.compat",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'perseus_megatron' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
