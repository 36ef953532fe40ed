"""SteadyLabel: a new text that fits asks no layout of anyone; one that needs more room gets it."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication, QHBoxLayout, QWidget

from tests.qt_events import EventCounter
from widgets.steady_label import SteadyLabel


def shown_whole(label: SteadyLabel) -> bool:
    """The label paints its text elided to its width: is nothing cut?"""
    width = label.contentsRect().width()
    return label.fontMetrics().elidedText(label.text(), Qt.TextElideMode.ElideRight, width) == label.text()


def test_a_text_that_fits_asks_for_no_layout_a_wider_one_does(qtbot) -> None:
    host = QWidget()
    qtbot.addWidget(host)
    label = SteadyLabel("KV 10 / 1024 pages")
    QHBoxLayout(host).addWidget(label)
    host.show()
    QApplication.processEvents()
    requests = EventCounter(host, QEvent.Type.LayoutRequest)
    for used in range(11, 99):
        label.setText(f"KV {used} / 1024 pages")
    QApplication.processEvents()
    assert requests.count == 0 and label.text() == "KV 98 / 1024 pages"
    assert shown_whole(label)
    assert label.accessibleName() == "KV 98 / 1024 pages"  # Qt's own text stays empty: assistive tools read this
    narrow = label.sizeHint().width()
    label.setText("KV 1000 / 1024 pages, and a note that needs room")
    QApplication.processEvents()
    assert requests.count >= 1 and label.sizeHint().width() > narrow
    assert shown_whole(label)


def test_a_new_font_measures_the_text_anew(qtbot) -> None:
    label = SteadyLabel("running 1 · waiting 0")
    qtbot.addWidget(label)
    before = label.sizeHint()
    font = QFont(label.font())
    font.setPointSizeF(font.pointSizeF() * 2)
    label.setFont(font)
    assert label.sizeHint().width() > before.width() and label.sizeHint().height() > before.height()
