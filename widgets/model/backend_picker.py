"""BackendPicker: which model the current chat talks to: the local engine or a model on a remote endpoint."""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

ADD = "__add_endpoint__"


class BackendPicker(QWidget):
    backend_chosen = Signal(str)  # a backend id
    add_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("backendPicker")
        self.combo = QComboBox()
        self.combo.setMinimumContentsLength(16)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setToolTip("The model this chat talks to: the studio's own engine or a remote endpoint")
        self.combo.activated.connect(self._activated)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 0, 6, 0)
        self.label = QLabel("Chat with")
        layout.addWidget(self.label)
        layout.addWidget(self.combo)
        self._current = ""

    def set_slim(self, slim: bool) -> None:
        """A slimmer form for a crowded toolbar (a large font): no "Chat with" (the tooltip says it), a narrower
        list; a long name still shows in full in the open list."""
        self.label.setVisible(not slim)
        self.combo.setMinimumContentsLength(10 if slim else 16)

    def set_choices(self, choices: list[tuple[str, str]]) -> None:
        """(backend id, label) pairs, the local engine first."""
        with QSignalBlocker(self.combo):
            self.combo.clear()
            for backend_id, label in choices:
                self.combo.addItem(label, backend_id)
            self.combo.insertSeparator(self.combo.count())
            self.combo.addItem("Add a remote endpoint…", ADD)
        self.set_current(self._current)

    def set_current(self, backend_id: str) -> None:
        self._current = backend_id
        index = self.combo.findData(backend_id)
        with QSignalBlocker(self.combo):
            if index < 0 and backend_id:  # a chat on an endpoint that was removed
                self.combo.insertItem(0, "unavailable endpoint", backend_id)
                index = 0
            self.combo.setCurrentIndex(index)

    def current(self) -> str:
        return self._current

    def _activated(self, index: int) -> None:
        backend_id = self.combo.itemData(index)
        if backend_id == ADD:
            self.set_current(self._current)  # the picker shows the chat's backend until one is added
            self.add_requested.emit()
        elif backend_id and backend_id != self._current:
            self._current = backend_id
            self.backend_chosen.emit(backend_id)
