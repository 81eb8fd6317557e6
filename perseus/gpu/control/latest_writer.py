"""``LatestWriter``: the never-blocking request path both clock controllers share.

Why: the training thread sends one clock request per instruction and must never wait for the
controller process (a pipe) or ``perseus clockd`` (a socket). When the channel is full, a request
not yet handed to the kernel is worthless once a newer one exists (the newer clock replaces it),
so only the latest is kept; it goes out with the next request or at a blocking ``flush``. A
message the kernel took only in part (a stream socket may) is finished first, so the stream stays
framed.
"""

from __future__ import annotations

import select
import time
from typing import Callable


class LatestWriter:
    """Writes messages through ``write`` (``os.write`` on a pipe, ``socket.send``) without blocking.

    ``write`` returns how many bytes the kernel took, raises ``BlockingIOError`` when the channel
    is full, and any other ``OSError`` when it is broken; then ``on_broken`` is called once and
    nothing is written any more.
    """

    def __init__(self, write: Callable[[bytes], int], fileno: int, on_broken: Callable[[], None]) -> None:
        self._write = write
        self._fileno = fileno
        self._on_broken = on_broken
        self.tail = b""  # rest of a message the kernel took in part: goes out before anything else
        self.pending: bytes | None = None  # the latest message not yet handed to the kernel
        self.broken = False

    def offer(self, msg: bytes) -> bool:
        """Send ``msg`` now if the channel takes it, else keep it instead of any older pending one."""
        if self.tail or self.broken:
            self.pending = msg
            return self.drain()
        self.pending = None
        try:  # the hot path: one write, nothing older to send first
            n = self._write(msg)
        except (BlockingIOError, InterruptedError):
            self.pending = msg
            return False
        except OSError:
            return self._break()
        if n < len(msg):
            self.tail = msg[n:]
            return False
        return True

    def drain(self) -> bool:
        """Hand the tail and the pending message to the kernel without blocking; True when none is left.
        A pending message becomes the tail only once the kernel took part of it, so until then a
        newer one still replaces it."""
        while (self.tail or self.pending is not None) and not self.broken:
            data = self.tail or self.pending or b""  # the loop's condition: one of the first two is there
            try:
                n = self._write(data)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return self._break()
            if not self.tail:
                self.pending = None
            self.tail = data[n:]
        return not self.broken

    def _break(self) -> bool:
        self.broken = True
        self.pending = None
        self._on_broken()
        return False

    def flush(self, deadline: float) -> bool:
        """Block until everything offered is written (False at ``deadline`` or on a broken channel)."""
        while not self.drain():
            if self.broken or time.monotonic() > deadline:
                return False
            select.select([], [self._fileno], [], 0.05)
        return True

    def send(self, msg: bytes, deadline: float) -> bool:
        """Write what is pending, then ``msg``, blocking until ``deadline`` (flush, close)."""
        if not self.flush(deadline):
            return False
        self.pending = msg
        return self.flush(deadline)
