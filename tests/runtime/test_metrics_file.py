"""The JSONL metrics file keeps whole lines only, even when the disk fills half way through one."""

from __future__ import annotations

import errno
import json
import logging
import os

from perseus.runtime.metrics_file import MetricsFile


def test_lines_are_appended_whole(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    path.parent.mkdir()
    path.write_text('{"old": 1}\n')
    f = MetricsFile(path)
    f.write_line(json.dumps({"step": 0}))
    f.write_line(json.dumps({"step": 1}))
    f.close()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"old": 1}, {"step": 0}, {"step": 1}]


def test_disk_full_half_way_through_a_line_truncates_it_and_stops(tmp_path, monkeypatch, caplog):
    path = tmp_path / "m.jsonl"
    f = MetricsFile(path)
    f.write_line(json.dumps({"step": 0}))
    real_write = os.write
    calls = []

    def full_disk(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:5])  # part of the line lands
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with caplog.at_level(logging.WARNING, logger="perseus"):
        f.write_line(json.dumps({"step": 1, "pad": "x" * 100}))
        f.write_line(json.dumps({"step": 2}))  # stopped: not even tried
    monkeypatch.undo()
    f.close()
    assert len(calls) == 2
    assert path.read_text() == '{"step": 0}\n'
    assert f.error == "No space left on device"
    (line,) = [r.getMessage() for r in caplog.records if "metrics file" in r.getMessage()]
    assert str(path) in line and "No space left on device" in line
