"""ElidedLabel: one line of text that shortens itself with "…" instead of widening the window; the whole text is
its tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QSizePolicy, QWidget

from widgets.steady_label import SteadyLabel, text_width


class ElidedLabel(SteadyLabel):
    """A QLabel asks for its whole text's width as its minimum, so a long status or path grows the window; this one
    asks for a few characters and elides the rest (Qt.ElideRight by default). Its width comes from the layout alone,
    so a new text never asks for a layout (SteadyLabel)."""

    def __init__(
        self, text: str = "", parent: QWidget | None = None, mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight
    ) -> None:
        self._mode = mode
        self._own_tip = ""
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def _asks_for_room(self) -> bool:
        return False

    def _elide_mode(self) -> Qt.TextElideMode:
        return self._mode

    def _text_changed(self) -> None:
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
        return text_width(self, self.text()) > self.contentsRect().width()

    def sizeHint(self) -> QSize:
        return QSize(text_width(self, self.text()), self.fontMetrics().height()) + self._chrome()

    def minimumSizeHint(self) -> QSize:
        return QSize(text_width(self, "M" * 4), self.fontMetrics().height()) + self._chrome()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._sync_tip()
