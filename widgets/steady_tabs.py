"""SteadyTabWidget: a QTabWidget that repaints its page only when its own layout changed, not for every layout
request from inside the page."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QTabWidget, QWidget

CORNERS = (Qt.Corner.TopLeftCorner, Qt.Corner.TopRightCorner)


class SteadyTabWidget(QTabWidget):
    """QTabWidget answers every LayoutRequest (one comes whenever any layout inside the current page changes: a Stop
    button shown for Send, a reply's footer, a tab's title) by placing its tab bar and page again and repainting the
    whole page. Where nothing that places them changed (its size, the tab bar's and the page's size hints, the corner
    widgets), placing them again would put them where they are: the request is left to the page's own layouts, which
    repaint what they moved."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._placed: tuple | None = None  # what the last placing was computed from

    def _placing(self) -> tuple:
        bar = self.tabBar()
        corners = tuple(
            None if widget is None else (widget.sizeHint(), widget.minimumSizeHint(), widget.isVisible())
            for widget in map(self.cornerWidget, CORNERS)
        )
        return (
            self.size(), bar.sizeHint(), bar.minimumSizeHint(), bar.isVisible(), self.count(), self.currentIndex(),
            self.sizeHint(), self.minimumSizeHint(), self.tabPosition(), self.documentMode(), corners,
            self.layoutDirection(), self.style(),
        )  # fmt: skip

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:
            placing = self._placing()
            if placing == self._placed:
                return True
            self._placed = placing
        return super().event(event)

    def resizeEvent(self, event) -> None:
        self._placed = None  # a new size places everything anew
        super().resizeEvent(event)
