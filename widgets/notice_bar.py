"""NoticeBar: an inline, dismissable message strip (info or error) with an optional action, instead of a modal."""

from __future__ import annotations

import re
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QToolButton, QWidget

INFO = "info"
ERROR = "error"

_LONG_WORD = re.compile(r"\S{32,}")
_BREAK_AFTER = re.compile(r"([/\\_.:?&=-])")


def breakable(text: str) -> str:
    """Long words (paths, URLs, hub errors) get invisible break points after their separators: a word-wrapped
    label cannot break inside a word, and would otherwise ask for the whole word's width."""
    return _LONG_WORD.sub(lambda m: _BREAK_AFTER.sub("\\1\u200b", m.group(0)), text)


class NoticeBar(QFrame):
    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # titles and paths in notices are never markup
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # as wide as the window gives, never wider: the text wraps (a long message must not widen the window)
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._text = ""
        self.action_button = QPushButton()
        self.action_button.setVisible(False)
        close = QToolButton()
        close.setText("✕")
        close.setToolTip("Dismiss")
        close.setAutoRaise(True)
        close.clicked.connect(self.dismiss)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button)
        layout.addWidget(close)
        self._action: Callable[[], None] | None = None
        self.action_button.clicked.connect(self._run_action)
        self.setVisible(False)

    @property
    def text(self) -> str:
        return self._text

    def show_message(
        self,
        text: str,
        level: str = INFO,
        action: tuple[str, Callable[[], None]] | None = None,
    ) -> None:
        self.setProperty("level", level)
        self.style().unpolish(self)  # re-read the style sheet: the colours depend on the level property
        self.style().polish(self)
        self._text = text
        self.label.setText(breakable(text))
        self._action = action[1] if action else None
        self.action_button.setText(action[0] if action else "")
        self.action_button.setVisible(action is not None)
        self.setVisible(True)

    def dismiss(self) -> None:
        self.setVisible(False)
        self.label.clear()
        self._text = ""
        self.dismissed.emit()

    def _run_action(self) -> None:
        action = self._action
        self.dismiss()
        if action is not None:
            action()
