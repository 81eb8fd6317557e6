"""Controller notices cross the process boundary as dicts and reach the runtime as ``ClockNotice``."""

from __future__ import annotations

from perseus.gpu.control.notice import ClockNotice


def test_wire_dicts_become_typed_notices_and_back():
    override = {"event": "override", "expected": 900, "found": 1410, "reapplied": True, "count": 1, "max": 3}
    notice = ClockNotice.from_wire({"op": "notice", "gpu": 0, **override})  # clockd's reply carries op and gpu
    assert notice is not None and notice.kind == "override" and (notice.expected, notice.found) == (900, 1410)
    assert notice.as_dict() == override, "the run's event records what the controller sent"
    assert "held 900 MHz, read back 1410 MHz" in notice.describe() and "1 of at most 3 times" in notice.describe()
    failed = ClockNotice.from_wire({"event": "failed", "message": "GPU is lost", "reset": False})
    assert failed == ClockNotice.failed("GPU is lost", reset=False)
    assert failed.as_dict() == {"event": "failed", "message": "GPU is lost", "reset": False}
    for event in ({"event": "ready"}, {"event": "sync", "seq": 3}, {"op": "error"}):
        assert ClockNotice.from_wire(event) is None, "only override and failed are notices"
