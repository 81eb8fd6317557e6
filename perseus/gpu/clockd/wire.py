"""Wire format of ``perseus clockd``: length-prefixed JSON frames over a Unix stream socket.

One frame = a 4-byte big-endian unsigned payload length, then that many bytes of UTF-8 JSON
holding one object with an ``"op"`` string. Requests (client → daemon) may be at most
``MAX_REQUEST`` bytes; a longer announced length cannot be resynchronized, so the daemon answers
with an error and drops that client. Everything inside a well-framed request is checked here
(``parse_request``) before the daemon acts on it: unknown ops, missing or mistyped fields and
out-of-range numbers are ``ProtocolError``s the daemon reports without dropping the client.

Requests::

    HELLO {"op": "hello", "v": 1 | 2, "pid": int, "cuda_visible_devices": str | null,
           "devices": [cuda index, ...], "uuids": [str, ...] | null,
           "clock_check_s": number}                       # v2 only; optional, 0 = never
    SET   {"op": "set", "gpu": slot, "mhz": int}          # no reply on success
    RESET {"op": "reset", "gpu": slot}                    # no reply on success
    SYNC  {"op": "sync", "seq": int}                      # → {"op": "sync", "seq", stats...}
    BYE   {"op": "bye"}                                   # reset my GPUs → {"op": "bye", "reset": bool}

``slot`` is the position of a GPU in the HELLO reply's ``gpus`` list. Replies are
``{"op": "ok", "v", "clock_check_s", "gpus": [{"slot", "uuid", "name", "clocks", "default_mhz"}, ...]}``
for HELLO, the SYNC/BYE answers above, and ``{"op": "error", "code": str, "message": str}``
(asynchronous for SET/RESET: the client reads them at its next ``flush()``).

Version 2 adds what the local controller process reports unasked (``control.keeper``): the daemon
reads a held lock back every ``clock_check_s`` (never more often than its ``--min-clock-check-s``)
and sends, at any time, ``{"op": "notice", "gpu": slot, "event": "override", "expected",
"found", "reapplied", "count", "max"}`` or ``{"op": "notice", "gpu": slot, "event": "failed",
"message", "reset"}`` (the device refused a clock: that GPU stays at default clocks until the
client reconnects). A version-1 client gets a refused clock as an ``error`` reply instead, and no
read-back.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from perseus.errors import PerseusError

VERSION = 2  # what this client speaks
SUPPORTED_VERSIONS = (1, 2)  # what the daemon accepts in HELLO
MAX_CHECK_S = 3600.0
HEADER = struct.Struct(">I")
MAX_REQUEST = 4096  # bytes of JSON per request; HELLO with 64 GPUs fits comfortably
MAX_REPLY = 1 << 20  # replies carry stats and clock lists; the client accepts up to this
MAX_DEVICES = 64
MAX_INT = 1 << 31

# Error codes (the ``code`` of an error reply).
E_FORBIDDEN = "forbidden"  # peer uid/gid not in the allowlist
E_BUSY = "busy"  # GPU held by another live client
E_NOT_FOUND = "not-found"  # GPU not managed by this daemon / not visible to the client
E_BAD_REQUEST = "bad-request"  # malformed frame or message
E_BAD_CLOCK = "bad-clock"  # clock not supported by that GPU
E_DEVICE = "device-error"  # the driver refused
E_TOO_BIG = "frame-too-large"
E_OVERLOADED = "overloaded"  # too many clients


class ProtocolError(PerseusError):
    """A request the daemon cannot accept; ``code`` is sent back with the message. A ``PerseusError``
    like every error a caller can cause (the daemon and client catch it by its own name)."""

    def __init__(self, message: str, code: str = E_BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


def frame(msg: dict[str, Any]) -> bytes:
    """Encode one message as a frame."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def split_frames(buf: bytearray, max_len: int) -> list[bytes]:
    """Remove every complete frame from ``buf`` and return their payloads (incomplete tail stays).

    Raises ``ProtocolError(E_TOO_BIG)`` as soon as a header announces more than ``max_len``.
    """
    out: list[bytes] = []
    while len(buf) >= HEADER.size:
        (n,) = HEADER.unpack_from(buf, 0)
        if n > max_len:
            raise ProtocolError(f"frame of {n} bytes exceeds the limit of {max_len}", E_TOO_BIG)
        if len(buf) < HEADER.size + n:
            break
        out.append(bytes(buf[HEADER.size:HEADER.size + n]))
        del buf[:HEADER.size + n]
    return out


def decode(payload: bytes) -> dict[str, Any]:
    """Payload → JSON object with a string ``op`` (``ProtocolError`` otherwise)."""
    try:
        msg = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("payload is not UTF-8 JSON") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise ProtocolError("message must be a JSON object with a string 'op'")
    return msg


def _int(msg: dict[str, Any], key: str, lo: int = 0, hi: int = MAX_INT) -> int:
    value = msg.get(key)
    if type(value) is not int or not lo <= value < hi:  # bool is not an int here
        raise ProtocolError(f"'{key}' must be an integer in [{lo}, {hi}), got {value!r}")
    return value


@dataclass(frozen=True)
class Hello:
    pid: int
    cuda_visible_devices: str | None
    devices: tuple[int, ...]
    uuids: tuple[str, ...] | None
    version: int = 1
    clock_check_s: float = 0.0  # read a held lock back this often (v2; 0: never)


@dataclass(frozen=True)
class SetClock:
    gpu: int
    mhz: int


@dataclass(frozen=True)
class ResetClock:
    gpu: int


@dataclass(frozen=True)
class Sync:
    seq: int


@dataclass(frozen=True)
class Bye:
    pass


Request = Hello | SetClock | ResetClock | Sync | Bye


def parse_request(payload: bytes) -> Request:
    """Decode and validate one request payload (``ProtocolError`` on anything unexpected)."""
    msg = decode(payload)
    op = msg["op"]
    if op == "set":
        return SetClock(_int(msg, "gpu", 0, MAX_DEVICES), _int(msg, "mhz", 1, 100_000))
    if op == "reset":
        return ResetClock(_int(msg, "gpu", 0, MAX_DEVICES))
    if op == "sync":
        return Sync(_int(msg, "seq"))
    if op == "bye":
        return Bye()
    if op == "hello":
        version = msg.get("v")
        if type(version) is not int or version not in SUPPORTED_VERSIONS:
            raise ProtocolError(f"protocol version {version!r} is not supported (this daemon speaks "
                                f"{', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade perseus on this node")
        cvd = msg.get("cuda_visible_devices")
        if cvd is not None and (not isinstance(cvd, str) or len(cvd) > 2048):
            raise ProtocolError("'cuda_visible_devices' must be a string or null")
        devices = msg.get("devices", [0])
        if (not isinstance(devices, list) or not 1 <= len(devices) <= MAX_DEVICES
                or any(type(d) is not int or not 0 <= d < MAX_DEVICES for d in devices)
                or len(set(devices)) != len(devices)):
            raise ProtocolError(f"'devices' must be 1–{MAX_DEVICES} distinct CUDA indices")
        uuids = msg.get("uuids")
        if uuids is not None and (not isinstance(uuids, list) or len(uuids) != len(devices)
                                  or any(not isinstance(u, str) or not 0 < len(u) <= 128 for u in uuids)):
            raise ProtocolError("'uuids' must be null or one UUID string per entry of 'devices'")
        check_s = msg.get("clock_check_s", 0.0)
        if "clock_check_s" in msg and version < 2:
            raise ProtocolError("'clock_check_s' needs protocol version 2")
        if type(check_s) not in (int, float) or not 0.0 <= check_s <= MAX_CHECK_S:  # NaN fails too
            raise ProtocolError(f"'clock_check_s' must be a number of seconds in [0, {MAX_CHECK_S:g}], got {check_s!r}")
        return Hello(_int(msg, "pid"), cvd, tuple(devices), tuple(uuids) if uuids is not None else None,
                     version, float(check_s))
    raise ProtocolError(f"unknown op {op[:32]!r}")
