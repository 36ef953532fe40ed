"""ElidedLabel: one line of text that shortens itself with "…" instead of widening the window; the whole text is
its tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """A QLabel asks for its whole text's width as its minimum, so a long status or path grows the window; this one
    asks for a few characters and elides the rest (Qt.ElideRight by default)."""

    def __init__(
        self, text: str = "", parent: QWidget | None = None, mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight
    ) -> None:
        super().__init__(text, parent)
        self._mode = mode
        self._own_tip = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self._sync_tip()

    def setToolTip(self, tip: str) -> None:
        self._own_tip = tip
        self._sync_tip()

    def _sync_tip(self) -> None:
        # the whole text where it does not fit, then whatever the owner wanted to say about it
        text = self.text()
        tip = "\n".join(part for part in (text if self.elided else "", self._own_tip) if part)
        super().setToolTip(tip)

    def toolTip(self) -> str:
        """What the owner set (the shown tooltip adds the whole text while it is elided)."""
        return self._own_tip

    @property
    def elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.fontMetrics().horizontalAdvance("M" * 4)), hint.height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._sync_tip()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), self._mode, rect.width())
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), text)
