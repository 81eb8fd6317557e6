"""The control thread runs calls in the order asked, hands exceptions back, and cancels what a
closing plane will never need."""

from __future__ import annotations

import threading

import pytest

from perseus.runtime.plane.control_thread import ControlThread


def test_calls_run_in_order_on_one_other_thread_and_raise_where_awaited():
    thread = ControlThread()
    seen: list[tuple[int, str]] = []
    futures = [thread.submit(lambda i=i: seen.append((i, threading.current_thread().name)) or i) for i in range(20)]
    assert [f.result(10) for f in futures] == list(range(20))
    assert [i for i, _ in seen] == list(range(20)) and {name for _, name in seen} == {"perseus-control"}

    def fails() -> None:
        raise RuntimeError("gloo: peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        thread.call(fails)
    assert thread.call(lambda: 7) == 7  # still serving after a failed call
    thread.close()


def test_close_cancels_calls_not_started():
    thread = ControlThread()
    gate, started = threading.Event(), threading.Event()
    running = thread.submit(lambda: started.set() or gate.wait())
    assert started.wait(30)  # the first call is running before the others queue behind it
    queued = [thread.submit(lambda: "never") for _ in range(3)]
    closer = threading.Thread(target=thread.close, kwargs={"wait_s": 5.0})
    closer.start()
    closer.join(0.2)
    gate.set()
    closer.join(5)
    assert running.result(5) is True
    assert all(f.cancelled() for f in queued)
