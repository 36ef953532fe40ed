"""CodeBlockView: one fenced code block in a monospace, unwrapped view with a language label and a copy button."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontDatabase, QGuiApplication, QTextCursor, QWheelEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QToolButton, QVBoxLayout, QWidget


class _CodeText(QPlainTextEdit):
    font_changed = Signal()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:  # the style sheet sets the code font and size after creation
            self.font_changed.emit()

    def wheelEvent(self, event: QWheelEvent) -> None:
        # vertical wheel over a code block scrolls the transcript; only sideways scrolling stays here
        if event.angleDelta().x() != 0 and event.angleDelta().y() == 0:
            super().wheelEvent(event)
        else:
            event.ignore()


class CodeBlockView(QFrame):
    copied = Signal(str)

    def __init__(self, text: str = "", language: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self._language = QLabel(language or "code")
        self._language.setObjectName("codeLanguage")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy this code block")
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(self.copy)
        header = QHBoxLayout()
        header.setContentsMargins(8, 2, 4, 0)
        header.addWidget(self._language)
        header.addStretch(1)
        header.addWidget(self.copy_button)

        self.editor = _CodeText()
        self.editor.setObjectName("codeText")
        self.editor.setReadOnly(True)
        self.editor.setUndoRedoEnabled(False)  # read-only: no undo record for each streamed frame of code
        self.editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.editor.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.editor.setFrameShape(QFrame.Shape.NoFrame)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        # where the system's fixed font resolves to a proportional one (a machine with few fonts), still monospace
        font.setFixedPitch(True)
        font.setStyleHint(QFont.StyleHint.TypeWriter)
        self.editor.setFont(font)
        self.editor.horizontalScrollBar().rangeChanged.connect(self._fit_height)
        self.editor.font_changed.connect(self._fit_height)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(1, 1, 1, 1)
        layout.setSpacing(0)
        layout.addLayout(header)
        layout.addWidget(self.editor)
        self.set_text(text, language)
        self._fit_height()

    @property
    def text(self) -> str:
        return self.editor.toPlainText()

    def set_text(self, text: str, language: str = "") -> None:
        if language:
            self._language.setText(language)
        current = self.editor.toPlainText()
        if text == current:
            return
        if current and text.startswith(current):
            # append only the new tail: re-setting the whole text while streaming resets the view
            cursor = QTextCursor(self.editor.document())
            cursor.beginEditBlock()  # the cursor is placed without laying the block out first (see ProseView)
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(text[len(current) :])
            cursor.endEditBlock()
        else:
            self.editor.setPlainText(text)
        self._fit_height()

    def _fit_height(self) -> None:
        lines = max(1, self.editor.document().blockCount())
        metrics = self.editor.fontMetrics()
        margin = int(self.editor.document().documentMargin() * 2) + self.editor.frameWidth() * 2
        bar = self.editor.horizontalScrollBar()
        scrollbar = bar.sizeHint().height() if bar.maximum() > 0 else 0
        self.editor.setFixedHeight(lines * metrics.lineSpacing() + margin + scrollbar)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self.copy_button.setText("Copied")
        QTimer.singleShot(1200, self.copy_button, lambda: self.copy_button.setText("Copy"))  # dies with the button
        self.copied.emit(self.text)
