"""EventPump: collects token events from engine threads and hands them to the UI once per frame, as one signal."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from engine.types import TokenEvent

FRAME_MS = 16


class EventPump(QObject):
    """The sink of every chat tab's request: sink() may be called from any thread; events_arrived fires in the UI
    thread, at most once per frame, with every event since the last one, so eight streaming tabs cost one signal per
    frame, not one per token."""

    events_arrived = Signal(list)  # list[TokenEvent], in arrival order
    _wake = Signal()

    def __init__(self, parent: QObject | None = None, frame_ms: int = FRAME_MS) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list[TokenEvent] = []
        self._scheduled = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(frame_ms)
        self._timer.timeout.connect(self.flush)
        self._wake.connect(self._timer.start, Qt.ConnectionType.QueuedConnection)

    def sink(self, events: list[TokenEvent]) -> None:
        with self._lock:
            self._pending.extend(events)
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._wake.emit()

    def flush(self) -> None:
        """Deliver what has arrived now (the frame timer calls this; shutdown calls it to drain)."""
        with self._lock:
            batch, self._pending = self._pending, []
            self._scheduled = False
        if batch:
            self.events_arrived.emit(batch)
