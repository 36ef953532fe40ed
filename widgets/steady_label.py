"""SteadyLabel: one line of plain text whose changes repaint the label alone, without re-laying out the window."""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QFontMetricsF, QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QWidget

REFIT_SLACK_EM = 4  # a text this much narrower than the room held gives the room back (digits ticking up do not)


def text_width(widget: QWidget, text: str) -> int:
    """The pixels `text` needs in the widget's font: rounded up (QFontMetrics.horizontalAdvance rounds to the nearest
    pixel, and a text given that width was elided)."""
    return math.ceil(QFontMetricsF(widget.font()).horizontalAdvance(text))


class SteadyLabel(QLabel):
    """QLabel::setText always asks the layout above for a new geometry, and the request climbs from layout to layout:
    at the chat tabs QTabWidget answers it by repainting the whole chat page. The context meter and the status bar
    change their counts four times a second while a reply streams, so a page of spin boxes and labels was repainted
    each time (3.5 ms a time, a third of the UI thread's work). This label keeps its text itself, paints it, and asks
    for a layout only when a text needs more room than it holds, or much less."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._text = ""
        self._room = 0  # the text width the layout has been asked for
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:
        if text == self._text:
            return
        self._text = text
        self.setAccessibleName(text)  # QLabel's own text stays empty: assistive tools read this instead
        width = text_width(self, text)
        slack = REFIT_SLACK_EM * text_width(self, "M")
        if self._asks_for_room() and (width > self._room or width < self._room - slack):
            self._room = width
            self.updateGeometry()
        self.update()
        self._text_changed()

    def _asks_for_room(self) -> bool:
        """Whether the text's width is part of the label's size hint (an eliding label's is not)."""
        return True

    def _text_changed(self) -> None:
        """For subclasses: the text changed."""

    def _chrome(self) -> QSize:
        """What the frame, margins and style take around the text."""
        return self.rect().size() - self.contentsRect().size()

    def sizeHint(self) -> QSize:
        return QSize(self._room, self.fontMetrics().height()) + self._chrome()

    def minimumSizeHint(self) -> QSize:
        return self.sizeHint()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._room = text_width(self, self._text)  # a new font measures the text anew
            self.updateGeometry()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self._text, self._elide_mode(), rect.width())
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), text)

    def _elide_mode(self) -> Qt.TextElideMode:
        return Qt.TextElideMode.ElideRight  # squeezed below its hint by a narrow window, it elides rather than clips
