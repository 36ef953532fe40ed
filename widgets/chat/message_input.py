"""ChatInput: the message box; Enter sends and Shift+Enter starts a new line (or Ctrl+Enter sends, if chosen)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

SEND_ENTER = "enter"
SEND_CTRL_ENTER = "ctrl+enter"
SEND_KEYS = {SEND_ENTER: "Enter sends, Shift+Enter new line", SEND_CTRL_ENTER: "Ctrl+Enter sends, Enter new line"}


class ChatInput(QPlainTextEdit):
    send_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatInput")
        self.setTabChangesFocus(True)
        self.send_key = SEND_ENTER
        self._update_placeholder()
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._fit_height()

    def set_send_key(self, send_key: str) -> None:
        self.send_key = send_key if send_key in SEND_KEYS else SEND_ENTER
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        self.setPlaceholderText(f"Message the model… ({SEND_KEYS[self.send_key]})")

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            modifiers = event.modifiers()
            ctrl = bool(modifiers & Qt.KeyboardModifier.ControlModifier)
            shift = bool(modifiers & Qt.KeyboardModifier.ShiftModifier)
            sends = (ctrl and not shift) if self.send_key == SEND_CTRL_ENTER else not (shift or ctrl)
            if sends:
                self.send()
                return
            self.insertPlainText("\n")  # Qt's own Shift+Enter inserts a line separator (U+2028), not a newline
            return
        super().keyPressEvent(event)

    def send(self) -> None:
        text = self.toPlainText()
        if text.strip():
            self.send_requested.emit(text)

    def _fit_height(self, *_args) -> None:
        """Grow with the text from one line up to about eight, then scroll."""
        lines = min(8, max(2, int(self.document().size().height())))
        metrics = self.fontMetrics()
        margins = int(self.document().documentMargin() * 2) + self.frameWidth() * 2 + 4
        self.setFixedHeight(lines * metrics.lineSpacing() + margins)
