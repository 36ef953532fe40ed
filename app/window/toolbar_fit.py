"""Keeps the main toolbar's actions on screen at large fonts: short labels (and a slimmer model selector) when the
full ones do not fit, and a clearly marked "More" overflow only when the window is too narrow even for those."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleFactory, QToolBar, QToolButton, QWidget

EXTENSION = "qt_toolbar_ext_button"  # Qt's own overflow button of a QToolBar (the theme styles it by this name)
MORE = "More"
MORE_TIP = "More toolbar actions: the window is too narrow for all of them"


class OverflowStyle(QProxyStyle):
    """The application's style, with room in the toolbar for an overflow button that says "» More" (Qt reserves
    a 12-pixel square for a bare »)."""

    def __init__(self, toolbar: QToolBar) -> None:
        super().__init__(QStyleFactory.create(QApplication.style().name()))
        self._toolbar = toolbar

    def pixelMetric(self, metric, option=None, widget=None) -> int:
        if metric == QStyle.PixelMetric.PM_ToolBarExtensionExtent:
            metrics = self._toolbar.fontMetrics()
            return metrics.horizontalAdvance(f"» {MORE}") + 2 * metrics.height()
        return super().pixelMetric(metric, option, widget)


class ToolbarFit(QObject):
    """Watches the toolbar's width and font; switches every action between its full and its short label (the
    short one is the action's iconText, which a text-only tool button shows) and the selector to its slim form.
    A faint 12-pixel » took Settings away at 16 pt; now it only appears when even short labels cannot fit."""

    def __init__(
        self,
        toolbar: QToolBar,
        short_labels: Sequence[tuple[QAction, str]],
        slim: Sequence[QWidget] = (),
    ) -> None:
        super().__init__(toolbar)
        self.toolbar = toolbar
        self._labels = [(action, action.iconText(), short) for action, short in short_labels]
        for action, _ in short_labels:
            action.setToolTip(action.toolTip())  # a tooltip Qt derives from the label would shrink with it
        self._slim = list(slim)  # widgets with a set_slim(bool) method (the model selector)
        self.compact = False
        self._full_need: int | None = None  # the width the full labels took at the current font
        self._busy = False
        toolbar.installEventFilter(self)
        style = OverflowStyle(toolbar)
        # a widget does not own the style it is given: the application does, so it outlives every toolbar using it
        style.setParent(QApplication.instance())
        toolbar.setStyle(style)
        extension = toolbar.findChild(QToolButton, EXTENSION)
        if extension is not None:  # Qt's faint » alone went unnoticed: it says what it holds
            extension.setText(MORE)
            extension.setToolTip(MORE_TIP)
            extension.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._full_need = None  # measured again at the new size
            self.fit()
        elif kind in (QEvent.Type.Resize, QEvent.Type.Show):
            self.fit()
        return False

    def need(self) -> int:
        """The width the toolbar's items take side by side as they are now labelled (what its layout asks)."""
        style = self.toolbar.style()
        spacing = style.pixelMetric(QStyle.PixelMetric.PM_ToolBarItemSpacing, None, self.toolbar)
        margin = style.pixelMetric(QStyle.PixelMetric.PM_ToolBarItemMargin, None, self.toolbar)
        frame = style.pixelMetric(QStyle.PixelMetric.PM_ToolBarFrameWidth, None, self.toolbar)
        handle = style.pixelMetric(QStyle.PixelMetric.PM_ToolBarHandleExtent, None, self.toolbar)
        widths = []
        for action in self.toolbar.actions():
            widget = self.toolbar.widgetForAction(action)
            if widget is not None and action.isVisible():
                widths.append(widget.sizeHint().width())
        moving = handle if self.toolbar.isMovable() else 0
        return sum(widths) + spacing * max(0, len(widths) - 1) + 2 * (margin + frame) + moving

    def fit(self) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            width = self.toolbar.width()
            if not self.compact:
                self._full_need = self.need()
                if self._full_need > width:
                    self._set_compact(True)
            elif self._full_need is None:  # a new font: measure the full labels again
                self._set_compact(False)
                self._full_need = self.need()
                if self._full_need > width:
                    self._set_compact(True)
            elif self._full_need <= width:
                self._set_compact(False)
        finally:
            self._busy = False

    def _set_compact(self, compact: bool) -> None:
        if compact == self.compact:
            return
        self.compact = compact
        for action, full, short in self._labels:
            action.setIconText(short if compact else full)
        for widget in self._slim:
            widget.set_slim(compact)  # type: ignore[attr-defined]
