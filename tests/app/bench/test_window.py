"""EventWait: the bench's wait for the window runs the event loop until told it is done, without polling."""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer

from app.bench.window import EventWait


def test_a_wait_ends_when_done_is_called_from_the_event_loop(qapp):
    wait = EventWait()
    QTimer.singleShot(50, wait.done)
    started = time.monotonic()
    assert wait.run(30.0)
    assert time.monotonic() - started < 10.0  # ended by done(), not by the limit


def test_a_wait_told_it_is_done_before_it_runs_returns_at_once(qapp):
    wait = EventWait()
    wait.done()
    assert wait.run(30.0)


def test_a_wait_never_told_ends_at_its_limit(qapp):
    wait = EventWait()
    started = time.monotonic()
    assert not wait.run(0.2)
    assert time.monotonic() - started >= 0.15
