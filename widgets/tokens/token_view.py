"""TokenView: a reply's tokens inline, word-wrapped, each one told apart by a faint alternating shade; hover one for
its probability and the alternatives the model weighed (when known); tokens that differ from another reply are marked.
Fed plain TokenEntry lists, appended as they stream."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QColor, QHelpEvent, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QTextEdit, QToolTip, QWidget

from widgets.tokens.data import TokenEntry, describe


class TokenView(QTextEdit):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("tokenView")
        self.setReadOnly(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.setMouseTracking(True)
        self._entries: list[TokenEntry] = []
        self._starts: list[int] = []  # document position where each entry begins
        self._marked: list[bool] = []
        self.show_boundaries = True

    # ---- data -------------------------------------------------------------------------------
    @property
    def entries(self) -> list[TokenEntry]:
        return list(self._entries)

    @property
    def marked(self) -> list[bool]:
        return list(self._marked)

    def set_entries(self, entries: Sequence[TokenEntry], marked: Sequence[bool] | None = None) -> None:
        self.clear()
        self._entries, self._starts, self._marked = [], [], []
        self.append_entries(entries)
        if marked is not None:
            self.set_marked(marked)

    def append_entries(self, entries: Sequence[TokenEntry]) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for entry in entries:
            self._starts.append(cursor.position())
            self._entries.append(entry)
            self._marked.append(False)
            cursor.insertText(entry.text, self._format(len(self._entries) - 1, False))

    def set_marked(self, marked: Sequence[bool]) -> None:
        """Mark entries (True: differs from the reply it is compared with); only the changed ones are re-coloured."""
        cursor = QTextCursor(self.document())
        for index, flag in enumerate(marked[: len(self._entries)]):
            if flag == self._marked[index]:
                continue
            self._marked[index] = flag
            cursor.setPosition(self._starts[index])
            cursor.setPosition(self._end(index), QTextCursor.MoveMode.KeepAnchor)
            cursor.setCharFormat(self._format(index, flag))

    # ---- look -------------------------------------------------------------------------------
    def _end(self, index: int) -> int:
        return self._starts[index + 1] if index + 1 < len(self._starts) else self.document().characterCount() - 1

    def _format(self, index: int, marked: bool) -> QTextCharFormat:
        fmt = QTextCharFormat()
        palette = self.palette()
        dark = palette.color(QPalette.ColorRole.Base).lightnessF() < 0.5
        if marked:
            fmt.setBackground(QColor("#7a4a12" if dark else "#ffd8a8"))
            fmt.setFontUnderline(True)
        elif self.show_boundaries and index % 2:
            shade = palette.color(QPalette.ColorRole.Base)
            fmt.setBackground(shade.lighter(125) if dark else shade.darker(106))
        return fmt

    # ---- hover ------------------------------------------------------------------------------
    def entry_at(self, point: QPoint) -> int | None:
        """The entry at a point of the document (viewport point plus scroll offsets), or None off the text."""
        position = self.document().documentLayout().hitTest(point, Qt.HitTestAccuracy.ExactHit)
        if position < 0 or not self._starts:
            return None
        index = bisect.bisect_right(self._starts, position) - 1
        return index if 0 <= index < len(self._entries) and position < self._end(index) else None

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            help_event: QHelpEvent = event  # type: ignore[assignment]
            point = help_event.pos() + QPoint(self.horizontalScrollBar().value(), self.verticalScrollBar().value())
            index = self.entry_at(point)
            if index is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(help_event.globalPos(), self.tooltip_for(index), self.viewport())
            return True
        return super().viewportEvent(event)

    def tooltip_for(self, index: int) -> str:
        text = describe(self._entries[index])
        if self._marked[index]:
            text += "\ndiffers from the reply it is compared with"
        return text
