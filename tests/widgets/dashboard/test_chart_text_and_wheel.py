"""Dashboard charts at 10 and 16 pt: axis room follows the font, the histogram's tick labels never touch, and the
wheel over a chart scrolls the dock (defect 7 of the window issue)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QFont, QFontMetrics, QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea

from widgets.dashboard.dashboard import DashboardWidget
from widgets.dashboard.panel import axis_room


@pytest.fixture
def font_size():
    app = QApplication.instance()
    original = app.font()

    def set_size(points: int) -> None:
        font = QFont(original)
        font.setPointSize(points)
        app.setFont(font)

    yield set_size
    app.setFont(original)


@pytest.mark.parametrize("points", [10, 16])
def test_the_axes_make_room_for_ticks_and_titles_at_the_font_size(qtbot, font_size, points) -> None:
    font_size(points)
    dashboard = DashboardWidget()
    qtbot.addWidget(dashboard)
    dashboard.apply_theme()
    metrics = QFontMetrics(QApplication.font())
    width, _height = axis_room()
    assert width >= metrics.horizontalAdvance("0000") + metrics.height()  # four-digit ticks beside the title
    for panel in dashboard.panels.values():
        for plot in panel.plots():
            left = plot.getAxis("left")
            if left.isVisible():
                assert left.minimumWidth() == width, (panel.key, left.minimumWidth())


@pytest.mark.parametrize("points", [10, 16])
def test_histogram_tick_labels_do_not_run_together(qtbot, font_size, points) -> None:
    font_size(points)
    dashboard = DashboardWidget()
    qtbot.addWidget(dashboard)
    dashboard.resize(420, 900)  # a narrow dock
    dashboard.show()
    dashboard.timer.stop()  # no engine behind it: its own refresh would draw an empty histogram over this one
    qtbot.wait(50)
    panel = dashboard.panels["streaming"]
    panel.histogram_curve.setData(np.linspace(0, 4200, 43), np.ones(42))
    panel.fit_histogram_ticks(0, 4200)
    qtbot.wait(20)
    axis = panel.histogram_plot.getAxis("bottom")
    ticks = axis._tickLevels[0] if axis._tickLevels else []
    assert len(ticks) >= 2
    metrics = QFontMetrics(QApplication.font())
    pixels = axis.width() / (4200 - 0)
    for (a, text_a), (b, text_b) in itertools.pairwise(ticks):
        room = (b - a) * pixels
        assert room > (metrics.horizontalAdvance(text_a) + metrics.horizontalAdvance(text_b)) / 2 + 4, ticks


def test_the_wheel_over_a_chart_scrolls_the_dashboard(qtbot) -> None:
    dashboard = DashboardWidget()
    qtbot.addWidget(dashboard)
    dashboard.resize(420, 500)  # shorter than its panels: it scrolls
    dashboard.show()
    qtbot.wait(50)
    scroll = dashboard.findChild(QScrollArea)
    bar = scroll.verticalScrollBar()
    assert bar.maximum() > 0
    canvas = dashboard.panels["throughput"].findChildren(type(dashboard.panels["throughput"].new_graphics()))[0]
    inside = QPointF(canvas.width() / 2, canvas.height() / 2)
    where = QPointF(canvas.mapToGlobal(QPoint(10, 10)))
    buttons, keys, phase = Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase
    event = QWheelEvent(inside, where, QPoint(0, 0), QPoint(0, -120), buttons, keys, phase, False)
    QApplication.sendEvent(canvas.viewport(), event)
    assert bar.value() > 0


@pytest.mark.parametrize("points", [10, 16])
def test_short_charts_label_ticks_apart_and_keep_room_for_their_titles(qtbot, font_size, points) -> None:
    from widgets.dashboard.panel import FittingAxis

    font_size(points)
    dashboard = DashboardWidget()
    qtbot.addWidget(dashboard)
    dashboard.apply_theme()
    line = QFontMetrics(QApplication.font()).height()
    axes = 0
    for panel in dashboard.panels.values():
        for plot in panel.plots():
            left = plot.getAxis("left")
            if not isinstance(left, FittingAxis):
                continue
            axes += 1
            for size in (40, 60, 120, 400):  # pixels of axis: a squeezed chart ... a tall one
                levels = left.tickSpacing(0.0, 150.0, size)
                major = levels[0][0]
                assert major <= 150  # a labelled tick above 0 always
                labels = int(150 // major) + 1
                if labels > 2:  # more than the two ends: they stand a line and a half apart
                    assert size / (labels - 1) >= 1.5 * line, (panel.key, size, levels)
            if left.labelText:  # the title running up the axis fits beside the chart
                assert plot.minimumHeight() >= QFontMetrics(QApplication.font()).horizontalAdvance(left.labelText)
    assert axes >= 5
