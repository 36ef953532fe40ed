"""While a reply streams, the counts that change (the context meter, the status bar's KV pages and requests) repaint
their own labels, never the whole chat page."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication

from tests.qt_events import EventCounter
from widgets.chat.context import ContextUsage


def settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(10)


def test_the_counts_of_a_streaming_reply_do_not_repaint_the_chat_page(qtbot, make_window) -> None:
    window = make_window(load=False)
    # the counts come from this test alone: with no engine, the window's own refresh (every 250 ms) would set
    # them back to none in the middle of the loop on a slow machine
    window.engine_status.stop()
    window.resize(1280, 800)
    window.show()
    settle(qtbot)
    panel = window.tabs.current.panel
    meter = panel.meter
    sidebar = None
    for reply in range(0, 1200, 100):  # the meter's text gains a digit on the way, and the status bar's counts
        usage = ContextUsage(system_tokens=20, history_tokens=80, reply_tokens=reply, context_tokens=8192)
        meter.set_usage(replace(usage, pages_held=(100 + reply) // 16))
        window.status.set_engine_state((100 + reply) // 16, 1024, 1, 0)
        settle(qtbot)
        # the sidebar's spin boxes and labels, which the counts have nothing to do with, counted from the second
        # count on: the first shows the meter's bar, a layout change of its own
        sidebar = sidebar or EventCounter(panel.sampling, QEvent.Type.Paint)
    assert "1,200 / 8,192" in meter.text
    assert window.status.pages_label.text() == "KV 75 / 1024 pages"
    for label in (window.status.pages_label, window.status.requests):  # painted whole, not "KV 75 / 1024 pag…"
        width = label.contentsRect().width()
        assert label.fontMetrics().elidedText(label.text(), Qt.TextElideMode.ElideRight, width) == label.text()
    assert sidebar.count == 0


def test_a_count_that_needs_more_room_gets_it_and_a_much_shorter_one_gives_it_back(qtbot, make_window) -> None:
    window = make_window(load=False)
    window.engine_status.stop()  # the texts come from this test alone
    window.resize(1280, 800)
    window.show()
    settle(qtbot)
    requests = window.status.requests
    requests.setText("running 1 · waiting 0")
    settle(qtbot)
    short = requests.width()
    requests.setText("running 0 · waiting 3 for the Capacity experiment")
    settle(qtbot)
    assert requests.width() >= requests.fontMetrics().horizontalAdvance(requests.text())  # shown whole
    requests.setText("running 1 · waiting 0")
    settle(qtbot)
    assert requests.width() == short  # the room goes back once the long text is gone


def test_a_layout_change_inside_the_page_repaints_what_moved_and_a_taller_tab_bar_moves_the_page(
    qtbot, make_window
) -> None:
    window = make_window(load=False)
    window.resize(1280, 800)
    window.show()
    settle(qtbot)
    panel = window.tabs.current.panel
    sidebar = EventCounter(panel.sampling, QEvent.Type.Paint)
    panel.set_busy(True)  # Stop takes Send's place: the message box's row changes, the sidebar does not
    settle(qtbot)
    panel.set_busy(False)
    settle(qtbot)
    assert sidebar.count == 0
    tabs = window.tabs.widget
    page_top = tabs.currentWidget().mapTo(tabs, QPoint(0, 0)).y()
    font = QFont(tabs.tabBar().font())
    font.setPointSizeF(font.pointSizeF() * 2)
    tabs.tabBar().setFont(font)  # a taller tab bar: the page must move down
    settle(qtbot)
    assert tabs.currentWidget().mapTo(tabs, QPoint(0, 0)).y() > page_top
