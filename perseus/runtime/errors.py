"""The errors every framework adapter raises about its hooks, defined once.

Why here: the Megatron, DeepSpeed and torch.distributed.pipelining adapters install the same kind
of hooks and fail the same two ways; one class each lets user code catch them whichever adapter it
uses (the adapters re-export them under their old names, so ``perseus_torch.HooksAlreadyInstalled``
is this class).
"""

from __future__ import annotations

from perseus.errors import PerseusError


class HooksAlreadyInstalled(PerseusError):
    """A second hook installation on a model, engine or schedule that already has Perseus hooks:
    ``uninstall()`` the first handle before installing again."""


class HookStateError(PerseusError):
    """The framework called the hooks in an order they cannot interpret (e.g. a step inside another)."""
