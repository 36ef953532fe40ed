"""EventCounter: how many events of one type a widget received (paints, layout requests), for tests of what a change
makes Qt do."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QWidget


class EventCounter(QObject):
    def __init__(self, widget: QWidget, kind: QEvent.Type) -> None:
        super().__init__()
        self.count = 0
        self._kind = kind
        widget.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        if event.type() == self._kind:
            self.count += 1
        return False
