"""The JSONL metrics file keeps whole lines only, even when the disk fills half way through one."""

from __future__ import annotations

import errno
import json
import logging
import os

from perseus.runtime.observe.metrics_file import MetricsFile, new_run_id, stamp


def test_lines_are_appended_whole(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    path.parent.mkdir()
    path.write_text('{"old": 1}\n')
    f = MetricsFile(path, run_id="r1")
    f.write_line(json.dumps({"step": 0}))
    f.write_line(json.dumps({"step": 1}))
    f.close()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [
        {"old": 1}, {"run_id": "r1", "step": 0}, {"run_id": "r1", "step": 1}]


def test_every_record_carries_the_run_id_of_its_runtime_first(tmp_path):
    """Steps and events alike; two writers on one file (a rerun appending) keep their own ids."""
    path = tmp_path / "m.jsonl"
    first, second = MetricsFile(path), MetricsFile(path)
    assert first.run_id != second.run_id
    first.write_line(json.dumps({"step": 0, "phase": "warmup"}))
    first.write_record({"event": "plan_received", "step": 1, "data": {"stage": 0}})
    second.write_line(json.dumps({"step": 0, "phase": "warmup"}))
    second.write_line("{}")
    first.close(), second.close()
    lines = path.read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["run_id"] for r in records] == [first.run_id, first.run_id, second.run_id, second.run_id]
    assert all(x.startswith('{"run_id": ') for x in lines)  # first key: readable with grep and head
    assert records[1] == {"run_id": first.run_id, "event": "plan_received", "step": 1, "data": {"stage": 0}}
    assert records[3] == {"run_id": second.run_id}


def test_run_ids_are_time_pid_and_random():
    a, b = new_run_id(), new_run_id()
    assert a != b and a.split("-")[1] == str(os.getpid()) and a[:8].isdigit() and a[8] == "T"
    assert stamp('  {"a": 1}', "x") == '{"run_id": "x", "a": 1}'


def test_disk_full_half_way_through_a_line_truncates_it_and_stops(tmp_path, monkeypatch, caplog):
    path = tmp_path / "m.jsonl"
    f = MetricsFile(path, run_id="r")
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
    assert path.read_text() == '{"run_id": "r", "step": 0}\n'
    assert f.error == "No space left on device"
    (line,) = [r.getMessage() for r in caplog.records if "metrics file" in r.getMessage()]
    assert str(path) in line and "No space left on device" in line
