"""The host's write-behind thread (agent/writebehind.py): order, failures, memory, idle."""

from __future__ import annotations

import threading
import time

import pytest

from remotemac.agent.writebehind import WriteBehind


def test_tasks_run_in_order_and_drain_waits_for_them():
    done: list[int] = []
    behind = WriteBehind(1 << 20)
    try:
        for i in range(200):
            behind.submit(lambda i=i: (time.sleep(0.0005 if i % 50 == 0 else 0), done.append(i)))
        behind.drain()
        assert done == list(range(200))
    finally:
        behind.close()


def test_first_failure_skips_later_tasks_and_reaches_the_reader():
    """A failed file must not be followed by later files being recorded as verified,
    and the reader must learn of it at its next submit or drain."""
    done: list[int] = []
    gate = threading.Event()
    behind = WriteBehind(1 << 20)
    try:
        behind.submit(gate.wait)
        behind.submit(lambda: (_ for _ in ()).throw(ValueError("sha256 differs")))
        behind.submit(lambda: done.append(3))
        gate.set()
        with pytest.raises(ValueError, match="sha256 differs"):
            behind.drain()
        with pytest.raises(ValueError):
            behind.submit(lambda: done.append(4))
        assert done == []
    finally:
        behind.close()


def test_submit_waits_while_the_queue_holds_its_limit():
    """Memory stays bounded: the reader waits instead of queueing more bytes."""
    gate = threading.Event()
    behind = WriteBehind(limit=100)
    try:
        behind.submit(gate.wait, 60)
        behind.submit(lambda: None, 30)  # 90 queued: under the limit
        blocked = threading.Thread(target=behind.submit, args=(lambda: None, 30))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive(), "a submit past the limit did not wait"
        gate.set()
        blocked.join(5)
        assert not blocked.is_alive()
        behind.drain()
    finally:
        gate.set()
        behind.close()


def test_idle_runs_once_the_queue_has_been_quiet_and_on_drain():
    """Acknowledgements go out within ~idle_after of the last file, batched, not per file."""
    calls: list[float] = []
    behind = WriteBehind(1 << 20, idle=lambda: calls.append(time.monotonic()), idle_after=0.02)
    try:
        for _ in range(100):
            behind.submit(lambda: None)
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls, "idle never ran after the queue went quiet"
        assert len(calls) < 100
        before = len(calls)
        behind.drain()
        assert len(calls) == before + 1
    finally:
        behind.close()


def test_close_lets_queued_tasks_finish():
    """A cut link ends the session: what was read whole is still stored and recorded."""
    done: list[int] = []
    behind = WriteBehind(1 << 20)
    for i in range(20):
        behind.submit(lambda i=i: (time.sleep(0.001), done.append(i)))
    behind.close()
    assert done == list(range(20))
