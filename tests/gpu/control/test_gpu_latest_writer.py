"""``LatestWriter``: never blocks, keeps only the latest unsent request, never splits a frame."""

from __future__ import annotations

import os
import time

from perseus.gpu.control.latest_writer import LatestWriter


class Channel:
    """A write end that takes ``room`` bytes, then would block; ``broken`` makes it fail."""

    def __init__(self, room: int) -> None:
        self.room, self.data, self.broken = room, b"", False

    def write(self, data: bytes) -> int:
        if self.broken:
            raise BrokenPipeError
        if self.room == 0:
            raise BlockingIOError
        n = min(self.room, len(data))
        self.room -= n
        self.data += bytes(data[:n])
        return n


def test_a_full_channel_keeps_only_the_latest_and_finishes_a_partial_message_first():
    ch = Channel(room=6)
    broken = []
    w = LatestWriter(ch.write, -1, lambda: broken.append(1))
    assert w.offer(b"AAAA")
    assert not w.offer(b"BBBB")  # 2 bytes taken: the rest must go before anything else
    assert w.tail == b"BB" and w.pending is None
    assert not w.offer(b"CCCC") and not w.offer(b"DDDD")  # waiting behind the tail: only the latest kept
    assert w.pending == b"DDDD"
    ch.room = 100
    assert w.drain() and ch.data == b"AAAABBBBDDDD"  # framing intact, C replaced by D
    ch.room = 0
    assert not w.offer(b"EEEE") and w.pending == b"EEEE" and w.tail == b""  # nothing taken: still replaceable
    assert not w.offer(b"FFFF") and w.pending == b"FFFF"
    ch.broken = True
    assert not w.drain() and w.broken and broken == [1]
    assert not w.offer(b"GGGG") and broken == [1]  # told once; nothing written any more
    assert ch.data == b"AAAABBBBDDDD"


def test_flush_blocks_until_written_or_the_deadline():
    r, wfd = os.pipe()
    os.set_blocking(wfd, False)
    try:
        w = LatestWriter(lambda data: os.write(wfd, data), wfd, lambda: None)
        while w.offer(b"x" * 4096):
            pass  # fill the pipe; the last block is pending
        assert not w.flush(time.monotonic() + 0.1)  # nobody reads: gives up at the deadline
        os.read(r, 1 << 20)
        assert w.send(b"END", time.monotonic() + 5)
        data = os.read(r, 1 << 20)
        assert data.endswith(b"END") and len(data) % 4096 == 3
    finally:
        os.close(r)
        os.close(wfd)
