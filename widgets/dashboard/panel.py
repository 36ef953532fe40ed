"""The base of every dashboard panel: a titled frame around pyqtgraph plots that redraws from a WindowView."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QSize
from PySide6.QtGui import QFont, QFontMetrics, QPalette, QWheelEvent
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from widgets.dashboard.data.series import WindowView
from widgets.dashboard.data.theme import DARK, LIGHT, Theme

# Antialiasing doubles the paint cost of dense curves; at 10 Hz the eye does not miss it.
pg.setConfigOptions(antialias=False, useOpenGL=False)

log = logging.getLogger(__name__)
_reported: set[str] = set()


def contained(method: Callable) -> Callable:
    """A dashboard bug is logged, not raised into Qt: an exception escaping a Qt override can take the whole
    process down (PySide 6.11 can crash while printing it), and no chart is worth the user's chats."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception:
            name = method.__qualname__
            if name not in _reported:  # a timer would repeat it ten times a second
                _reported.add(name)
                log.exception("dashboard: %s failed (later failures of it are logged at debug level)", name)
            else:
                log.debug("dashboard: %s failed again", name, exc_info=True)
            return None

    return wrapper


def theme_for(palette: QPalette) -> Theme:
    """Light or dark, following the window's palette (which follows the system)."""
    return DARK if palette.color(QPalette.ColorRole.Window).lightnessF() < 0.5 else LIGHT


class ChartCanvas(pg.GraphicsLayoutWidget):
    """A pyqtgraph canvas with a modest size hint (pyqtgraph asks for 640x480), so the dashboard fits its dock."""

    def sizeHint(self) -> QSize:
        return QSize(360, 180)

    def wheelEvent(self, event) -> None:
        """No chart zooms (the timer owns the axes): the wheel scrolls the dashboard, over a chart as anywhere else.
        Handed to the scroll area outright (a graphics view takes wheel events for itself)."""
        area = self.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is None:
            event.ignore()
            return
        target = area.viewport()
        position = QPointF(target.mapFromGlobal(event.globalPosition().toPoint()))
        forwarded = QWheelEvent(
            position, event.globalPosition(), event.pixelDelta(), event.angleDelta(), event.buttons(),
            event.modifiers(), event.phase(), event.inverted(),
        )  # fmt: skip
        QApplication.sendEvent(target, forwarded)
        event.accept()


class Panel(QFrame):
    """Subclasses build their plots in build() and draw a window of records in refresh()."""

    key = "panel"
    title = "Panel"
    explanation = ""
    REQUIRED = ("build", "refresh")

    def __init_subclass__(cls, **kwargs) -> None:
        # abstract methods, checked when a panel class is defined (Qt's metaclass rules out abc.ABCMeta)
        super().__init_subclass__(**kwargs)
        missing = [name for name in Panel.REQUIRED if getattr(cls, name) is getattr(Panel, name)]
        if missing:
            raise TypeError(f"dashboard panel {cls.__name__} must define {' and '.join(missing)}()")

    def __init__(self, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"dashboard-{self.key}")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.theme = theme
        self._title = QLabel(f"<b>{self.title}</b>")
        self._title.setToolTip(self.explanation)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 6)
        layout.setSpacing(2)
        layout.addWidget(self._title)
        self.body = layout
        self.build()
        self.apply_theme(theme)

    def build(self) -> None:
        """Create the panel's widgets and plots under self.body (every panel class defines it)."""

    def new_graphics(self) -> ChartCanvas:
        return ChartCanvas()

    def refresh(self, view: WindowView) -> None:
        """Draw the records of the window (every panel class defines it)."""

    def apply_theme(self, theme: Theme) -> None:
        self.theme = theme
        for graphics in self.findChildren(pg.GraphicsView):
            graphics.setBackground(theme.background)
        for plot in self.plots():
            style_plot(plot, theme)
        self.restyle()

    def restyle(self) -> None:
        """Set the pens and brushes of this panel's items from self.theme."""

    def plots(self) -> list[pg.PlotItem]:
        return []


class FittingAxis(pg.AxisItem):
    """A value axis whose labelled ticks stay a line and a half of text apart however short its chart: pyqtgraph
    labels at least three major ticks whatever the length, which stacked four labels into a 60 px chart at 16 pt."""

    def tickSpacing(self, minVal: float, maxVal: float, size: float):  # pyqtgraph names it
        levels = super().tickSpacing(minVal, maxVal, size)
        line = QFontMetrics(self.style["tickFont"] or QApplication.font()).height()
        span = abs(maxVal - minVal)
        if not levels or span == 0 or size <= 0:
            return levels
        fit = max(1, int(size / (1.5 * line)))  # intervals whose labels do not touch
        major = levels[0][0]
        if span / major <= fit:
            return levels
        return [(min(nice_step(span / fit), nice_floor(span)), 0)]  # one level: minor labels would crowd it


def nice_step(least: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least `least` (> 0)."""
    power = 10.0 ** np.floor(np.log10(least))
    return next(float(f * power) for f in (1, 2, 5, 10) if f * power >= least * (1 - 1e-9))


def nice_floor(most: float) -> float:
    """The largest 1, 2 or 5 times a power of ten that is at most `most` (> 0): a step that labels a tick above 0."""
    power = 10.0 ** np.floor(np.log10(most))
    return max(float(f * power) for f in (1, 2, 5) if f * power <= most * (1 + 1e-9))


def add_plot(layout: pg.GraphicsLayoutWidget, row: int, ylabel: str, xlabel: str | None = None) -> pg.PlotItem:
    """A plot with the live-view settings: clipped to the view, peak-downsampled, no mouse zoom fighting the timer."""
    plot = layout.addPlot(row=row, col=0, axisItems={"left": FittingAxis("left")})
    plot.setClipToView(True)
    plot.setDownsampling(auto=True, mode="peak")
    plot.setMenuEnabled(False)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    # no grid: pyqtgraph repaints grid lines with the axis on every scroll, the costliest part of a frame
    plot.setLabel("left", ylabel)
    if xlabel:
        plot.setLabel("bottom", xlabel)
    plot.getAxis("left").setWidth(axis_room()[0])
    plot.getViewBox().setLimits(yMin=0)  # counts and durations: never below zero, even when autoranging empty data
    return plot


def legend_html(entries: list[tuple[str, str, str]], muted: str) -> str:
    """A one-line legend above a chart (a pyqtgraph legend would cover the newest data): (colour, mark, text)."""
    parts = [f'<span style="color:{colour}">{mark}</span>&nbsp;{text}' for colour, mark, text in entries]
    return f'<span style="color:{muted}">' + " &nbsp; ".join(parts) + "</span>"


def legend_label() -> QLabel:
    label = QLabel()
    label.setObjectName("dashboard-legend")
    label.setWordWrap(True)  # a narrow dock puts the legend on two lines rather than cut it off
    # new text must not re-layout the dashboard (that would resize, and repaint, every chart)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    return label


def axis_room(font: QFont | None = None) -> tuple[int, int]:
    """(left axis width, bottom axis height) that hold tick values up to four digits and the axis title at the
    font's size: a fixed 52 px let ticks and titles overlap at 16 pt."""
    metrics = QFontMetrics(font or QApplication.font())
    return metrics.horizontalAdvance("0000.0") + metrics.height() + 8, 2 * metrics.height() + 6


def style_plot(plot: pg.PlotItem, theme: Theme) -> None:
    for name in ("left", "bottom", "right"):
        axis = plot.getAxis(name)
        axis.setPen(pg.mkPen(theme.muted))
        axis.setTextPen(pg.mkPen(theme.foreground))
    width, height = axis_room()
    bottom = plot.getAxis("bottom")
    left = plot.getAxis("left")
    if left.isVisible():
        left.setWidth(width)
        # the title runs up the axis: a chart shorter than it let two stacked charts' titles overlap at 16 pt
        title = " ".join(part for part in (left.labelText, f"({left.labelUnits})" if left.labelUnits else "") if part)
        below = height if bottom.isVisible() and bottom.style["showValues"] else 0  # the time axis under it
        plot.setMinimumHeight(QFontMetrics(QApplication.font()).horizontalAdvance(title) + 16 + below if title else 0)
        _fit_canvas(plot)
    if bottom.style["showValues"]:  # hidden time axes (shared with the plot below) keep their sliver
        bottom.setHeight(height)


def _fit_canvas(plot: pg.PlotItem) -> None:
    """The canvas holding `plot` is at least as tall as its plots' minimum heights together (the scene's layout
    does not tell the widget, so the panel would squeeze its charts below their titles)."""
    canvas = plot.getViewWidget()
    layout = getattr(canvas, "ci", None)
    if canvas is None or layout is None:
        return
    plots = [item for item in layout.items if isinstance(item, pg.PlotItem)]
    needed = sum(int(item.minimumHeight()) for item in plots) + 12 * len(plots)
    canvas.setMinimumHeight(needed)


def curve_data(item: pg.PlotDataItem) -> tuple[np.ndarray, np.ndarray]:
    """The full data a curve was given (not the clipped, downsampled copy it paints)."""
    x, y = item.xData, item.yData
    return (np.empty(0), np.empty(0)) if x is None else (np.asarray(x), np.asarray(y))


def set_window(plot: pg.PlotItem, view: WindowView) -> None:
    """The x axis runs from -window to 0 (now); setting the same range again costs nothing."""
    if plot.getViewBox().state["viewRange"][0] != [view.start, view.end]:
        plot.setXRange(view.start, view.end, padding=0)


def hide_time_axis(plot: pg.PlotItem) -> None:
    """Upper plots of a panel share the time axis of the one below: no labels to draw twice."""
    plot.getAxis("bottom").setStyle(showValues=False)
    plot.getAxis("bottom").setHeight(6)


TIME_LABEL = "seconds (0 = now)"


class PhaseMarks:
    """Dashed vertical lines, labelled, where the dashboard began reading another engine (an experiment's
    phases, a new model): what follows on the chart belongs to that engine."""

    def __init__(self, plot: pg.PlotItem) -> None:
        self.plot = plot
        # one curve of vertical segments spanning the view (drawn in view coordinates, so it scales with the axis)
        self.lines = pg.PlotCurveItem(connect="pairs")
        self.lines.setZValue(5)
        plot.addItem(self.lines, ignoreBounds=True)
        self.labels: list[pg.TextItem] = []
        self.colour = "#888888"
        self.marks: list[tuple[float, str]] = []

    def update(self, view: WindowView) -> None:
        # "experiment: prefix sharing, caching on" -> "caching on": the results table names the experiment
        self.marks = [(t, text.removeprefix("experiment: ").split(", ")[-1]) for t, text in view.annotations]
        low, high = self.plot.getViewBox().viewRange()[1]
        xs = np.repeat([t for t, _ in self.marks], 2)
        ys = np.tile([low, high], len(self.marks))
        self.lines.setData(xs, ys)
        while len(self.labels) < len(self.marks):
            label = pg.TextItem(color=self.colour, anchor=(0, 0))
            self.plot.addItem(label, ignoreBounds=True)
            self.labels.append(label)
        for i, label in enumerate(self.labels):
            if i < len(self.marks):
                label.setText(self.marks[i][1])
                # every other label a line lower: phases a few seconds apart would print over each other
                label.setPos(self.marks[i][0], high - (i % 2) * 0.14 * (high - low))
                label.show()
            else:
                label.hide()

    def restyle(self, colour: str) -> None:
        self.colour = colour
        self.lines.setPen(pg.mkPen(colour, width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        for label in self.labels:
            label.setColor(colour)
