"""Atomic writes: the old file or the new one, never half of one, and no temporary file left."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest

import perseus.atomic as atomic
from perseus.atomic import atomic_output, remove_temporaries, write_atomic
from perseus.frontier import Frontier, FrontierPoint, load_frontier, save_frontier
from perseus.profile import InstructionProfile, load_json, uniform_profile
from perseus.schedules import build_schedule


class _DiskFullAfter:
    """A file object that accepts ``limit`` bytes, then fails like a full disk."""

    def __init__(self, f, limit: int) -> None:
        self._f, self._left = f, limit

    def write(self, data) -> int:
        if len(data) > self._left:
            self._f.write(bytes(data[: self._left]))
            self._f.flush()  # the partial data really reaches the temporary file
            raise OSError(errno.ENOSPC, "No space left on device")
        self._left -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture
def disk_full(monkeypatch):
    """Every atomic write fails with ENOSPC after 10 bytes."""
    real_fdopen = os.fdopen
    monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: _DiskFullAfter(real_fdopen(fd, mode), 10))


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    write_atomic(path, "old")
    write_atomic(path, b"new bytes")
    assert path.read_bytes() == b"new bytes"
    assert _leftovers(tmp_path) == []


def test_new_file_gets_the_usual_permissions(tmp_path):
    path = tmp_path / "out.txt"
    write_atomic(path, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_error_inside_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old contents")
    with pytest.raises(RuntimeError):
        with atomic_output(path) as f:
            f.write(b"half of the new")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old contents"
    assert _leftovers(tmp_path) == []


def test_disk_full_half_way_keeps_the_old_file(tmp_path, disk_full):
    path = tmp_path / "out.txt"
    path.write_text("old contents")
    with pytest.raises(OSError) as info:
        write_atomic(path, "a much longer new content that does not fit")
    assert info.value.errno == errno.ENOSPC
    assert path.read_text() == "old contents"
    assert _leftovers(tmp_path) == []


def test_disk_full_while_saving_a_frontier_or_profile_keeps_the_old_one(tmp_path, request):
    schedule = build_schedule("1f1b", 2, 2)
    old = Frontier(schedule, 50.0, 1.0, 10.0, [FrontierPoint(1.0, 10.0, np.full(schedule.num_instructions, 1000))])
    new = Frontier(schedule, 50.0, 1.0, 10.0, [FrontierPoint(2.0, 8.0, np.full(schedule.num_instructions, 900))])
    ip = InstructionProfile((1000, 900), (0.01, 0.012), (1.0, 0.9))
    profile = uniform_profile(2, {"forward": ip, "backward": ip}, 50.0)
    save_frontier(old, tmp_path / "frontier.json")
    profile.save_json(tmp_path / "profile.json")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    request.getfixturevalue("disk_full")
    with pytest.raises(OSError):
        save_frontier(new, tmp_path / "frontier.json")
    with pytest.raises(OSError):
        profile.with_p_blocking(60.0).save_json(tmp_path / "profile.json")

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert load_frontier(tmp_path / "frontier.json").points[0].time_s == 1.0
    assert load_json(tmp_path / "profile.json").p_blocking_w == 50.0


def test_remove_temporaries_takes_only_the_named_writers_files(tmp_path):
    """A dead writer's temporary files go; another process's (even one whose pid ends in the same
    digits) and the targets stay."""
    (tmp_path / "key.json").write_text("{}")
    mine = [tmp_path / ".key.json.4242.0123abcd.tmp", tmp_path / ".frontier.json.4242.deadbeef.tmp"]
    others = [tmp_path / ".key.json.14242.0123abcd.tmp", tmp_path / ".key.json.4243.0123abcd.tmp",
              tmp_path / ".key.json.4242.notahex!.tmp"]
    for path in mine + others:
        path.write_text("half")
    assert sorted(remove_temporaries(tmp_path, 4242)) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["key.json"] + [p.name for p in others])
    assert remove_temporaries(tmp_path / "missing", 4242) == []
