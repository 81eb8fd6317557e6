"""Typed GPU errors.

Each error says what went wrong *and* what the user can do about it, because GPU problems are
almost always environmental (driver, privileges, device selection) rather than bugs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from perseus.errors import PerseusError

PERMISSION_HINT = (
    "Changing GPU clocks or power limits needs CAP_SYS_ADMIN. Either run as root, or grant the "
    "capability to this Python interpreter with "
    "`sudo setcap cap_sys_admin+ep $(readlink -f $(which python))`, "
    "or run Perseus in measure-only mode (no frequency changes, profiling and planning still work)."
)

# Both ways to choose the simulated GPU: the environment, and the config key of each launcher.
SIM_FIX = ('PERSEUS_GPU=sim in the environment, or "gpu": "sim" in the config '
           '(DeepSpeed\'s "perseus" section; --perseus-gpu sim for Megatron)')

LIBRARY_HINT = f"Install the NVIDIA driver and `pip install nvidia-ml-py`, or use the simulated GPU: {SIM_FIX}."


class GPUError(PerseusError):
    """Base class for every GPU-layer error."""

    what: str = ""  # the device or setting the error is about, where a subclass names one

    @classmethod
    def from_wire(cls, message: str) -> Self:
        """This error as another process raised and sent it: ``message`` is its whole text, hint
        included, so a subclass's ``__init__`` (which builds the text from ``what``) is not run
        again; ``what`` is the message too, the subject alone did not come over the wire."""
        err = cls.__new__(cls)
        Exception.__init__(err, message)
        err.what = message
        return err


class GPUNotSupportedError(GPUError):
    """The device or driver does not support the requested operation."""


class GPUPermissionError(GPUError):
    """The process lacks the privilege to change clocks or power limits."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what}: permission denied. {PERMISSION_HINT}")


class GPUNotFoundError(GPUError):
    """The requested GPU index/UUID does not exist or is not visible to this process."""


class GPULibraryMissingError(GPUError):
    """NVML (the NVIDIA driver's management library) or nvidia-ml-py is not available."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what}. {LIBRARY_HINT}")


class GPUInvalidArgumentError(GPUError, ValueError):
    """A clock, power limit or other argument is outside what the device accepts."""


# The classes a peer may name on a wire, by class name (``wire_kind``): what the trainer side rebuilds.
WIRE_KINDS: Mapping[str, type[GPUError]] = {cls.__name__: cls for cls in (
    GPUError, GPUNotSupportedError, GPUPermissionError, GPUNotFoundError, GPULibraryMissingError,
    GPUInvalidArgumentError)}


def wire_kind(exc: GPUError) -> str:
    """The kind to send ``exc`` as: its nearest class in ``WIRE_KINDS`` (a zeusd refusal goes as the
    ``GPUPermissionError`` it is, so the receiver may still fall back to measure-only)."""
    return next(c.__name__ for c in type(exc).__mro__ if WIRE_KINDS.get(c.__name__) is c)


def error_from_wire(kind: str, message: str, kinds: Mapping[str, type[GPUError]] = WIRE_KINDS) -> GPUError:
    """The typed error a peer sent as ``kind`` and ``message``: the class ``kinds`` names for it
    (``GPUError`` for a kind it does not name), built by that class's ``from_wire``, so callers can
    catch e.g. ``GPUPermissionError`` and go measure-only."""
    return kinds.get(kind, GPUError).from_wire(message)
