"""EventPump: collects token events from engine threads and hands them to the UI once per frame, as one signal."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from engine.types import TokenEvent

# a reply's text is laid out at most every 33 ms (STREAM_RENDER_MS), so a 16 ms frame woke the UI twice for one
# render: on two cores each wake comes out of the engine's threads (one chat: 1-1.5 % more tokens a second with 33)
FRAME_MS = 33
OPEN_LIMIT = 4096  # request ids remembered as under way; beyond it (ends never seen) the memory starts over


class EventPump(QObject):
    """The sink of every chat tab's request: sink() may be called from any thread; events_arrived fires in the UI
    thread, at most once per frame, with every event since the last one, so eight streaming tabs cost one signal per
    frame, not one per token. A reply's first event and its last are handed over at once, without waiting for the
    frame: the first token and the end are what a user waits for (a frame's wait was a tenth of the embedded model's
    time to first token)."""

    # list[TokenEvent], in arrival order; declared as object so every slot gets the one list, not a copy converted
    # for it (a frame's emit took 14 us as Signal(list), 6 us so): slots read it and never change it
    events_arrived = Signal(object)
    _wake = Signal()
    _wake_now = Signal()

    def __init__(self, parent: QObject | None = None, frame_ms: int = FRAME_MS) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list[TokenEvent] = []
        self._scheduled = False
        self._hurried = False  # a flush without the frame's wait is posted
        self._open: set[str] = set()  # requests whose first event came and whose last has not
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(frame_ms)
        self._timer.timeout.connect(self.flush)
        self._wake.connect(self._timer.start, Qt.ConnectionType.QueuedConnection)
        self._wake_now.connect(self.flush, Qt.ConnectionType.QueuedConnection)

    def sink(self, events: list[TokenEvent]) -> None:
        with self._lock:
            self._pending.extend(events)
            urgent = self._starts_or_ends(events) and not self._hurried
            self._hurried = self._hurried or urgent
            wake = not self._scheduled and not urgent
            self._scheduled = True
        if urgent:
            self._wake_now.emit()
        elif wake:
            self._wake.emit()

    def _starts_or_ends(self, events: list[TokenEvent]) -> bool:
        """Whether a request's first or last event is among these (under the lock)."""
        if len(self._open) > OPEN_LIMIT:
            self._open.clear()
        found = False
        for event in events:
            if event.finished:
                self._open.discard(event.request_id)
                found = True
            elif event.request_id not in self._open:
                self._open.add(event.request_id)
                found = True
        return found

    def flush(self) -> None:
        """Deliver what has arrived now (the frame timer calls this, a first or last event at once; shutdown calls
        it to drain)."""
        with self._lock:
            batch, self._pending = self._pending, []
            self._scheduled = self._hurried = False
        if batch:
            self.events_arrived.emit(batch)
