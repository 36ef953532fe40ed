"""SteadyProgressBar: a new value is painted with the next frame, once, never inside setValue as QProgressBar does."""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication, QProgressBar

from tests.qt_events import EventCounter
from widgets.steady_progress_bar import SteadyProgressBar


def shown(qtbot, bar: QProgressBar) -> EventCounter:
    qtbot.addWidget(bar)
    bar.setRange(0, 100)
    bar.setTextVisible(False)
    bar.setFixedSize(90, 12)
    bar.show()
    qtbot.waitExposed(bar)
    QApplication.processEvents()
    return EventCounter(bar, QEvent.Type.Paint)


def test_a_new_value_is_painted_with_the_next_frame_once(qtbot) -> None:
    plain = QProgressBar()
    plain_paints = shown(qtbot, plain)
    plain.setValue(50)
    assert plain_paints.count == 1  # Qt's bar: painted inside setValue (what this replaces; if Qt stops, so can we)

    bar = SteadyProgressBar()
    paints = shown(qtbot, bar)
    for value in (10, 20, 30, 40, 50):
        bar.setValue(value)
    assert paints.count == 0 and bar.value() == 50  # stored, not painted inside setValue
    qtbot.waitUntil(lambda: paints.count >= 1, timeout=2000)
    QApplication.processEvents()
    assert paints.count == 1  # five values, one paint with the frame
    bar.setValue(50)
    QApplication.processEvents()
    assert paints.count == 1  # the same value paints nothing
    assert bar.updatesEnabled()
