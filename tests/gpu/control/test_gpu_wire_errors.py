"""A typed GPU error sent over a wire (the controller process's pipe, clockd's socket) and rebuilt
on the trainer's side by the one definition both use: ``perseus.gpu.errors.error_from_wire``."""

from __future__ import annotations

import pytest

from perseus.gpu.clockd import wire
from perseus.gpu.clockd.client import ERROR_CLASSES as CLOCKD_ERRORS
from perseus.gpu.clockd.client import ClockdRefusedError
from perseus.gpu.errors import (
    PERMISSION_HINT,
    GPUError,
    GPUInvalidArgumentError,
    GPULibraryMissingError,
    GPUNotFoundError,
    GPUPermissionError,
    error_from_wire,
    wire_kind,
)


class _SomeBackendRefusal(GPUPermissionError):
    """A backend's own refusal (as zeusd's is): not a class the receiver knows by name."""


@pytest.mark.parametrize("sent", [
    GPUPermissionError("GPU 0"),
    GPULibraryMissingError("NVML is unavailable"),
    GPUInvalidArgumentError("99 MHz"),
    GPUError("something else"),
])
def test_an_error_comes_back_as_its_class_with_its_message_unchanged(sent):
    back = error_from_wire(wire_kind(sent), str(sent))
    assert type(back) is type(sent)
    assert str(back) == str(sent)  # the hint once, not formatted a second time by the constructor
    assert back.what == str(sent)


def test_a_permission_error_still_says_how_to_fix_it_once():
    back = error_from_wire("GPUPermissionError", str(GPUPermissionError("GPU 3")))
    assert isinstance(back, GPUPermissionError)
    assert str(back).count(PERMISSION_HINT) == 1


def test_a_subclass_goes_as_the_nearest_class_the_receiver_rebuilds():
    sent = _SomeBackendRefusal("zeusd at /run/zeusd.sock")
    assert wire_kind(sent) == "GPUPermissionError"
    assert type(error_from_wire(wire_kind(sent), str(sent))) is GPUPermissionError


@pytest.mark.parametrize("kind", ["NoSuchError", "PerseusError", "ValueError", "None", ""])
def test_an_unknown_kind_is_a_plain_gpu_error(kind):
    back = error_from_wire(kind, "the controller failed")
    assert type(back) is GPUError
    assert str(back) == "the controller failed"


def test_clockd_codes_map_to_their_classes_and_a_refusal_gets_its_hint_here():
    text = "perseus clockd at /run/c.sock: uid 1000 / gid 1000 may not change GPU clocks"
    refused = error_from_wire(wire.E_FORBIDDEN, text, CLOCKD_ERRORS)
    assert type(refused) is ClockdRefusedError and isinstance(refused, GPUPermissionError)
    assert str(refused) == str(ClockdRefusedError(text)) and "--allow-uid" in str(refused)
    assert type(error_from_wire(wire.E_NOT_FOUND, text, CLOCKD_ERRORS)) is GPUNotFoundError
    assert type(error_from_wire(wire.E_BAD_CLOCK, text, CLOCKD_ERRORS)) is GPUInvalidArgumentError
    other = error_from_wire(wire.E_BUSY, text, CLOCKD_ERRORS)
    assert type(other) is GPUError and str(other) == text
