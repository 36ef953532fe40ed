"""The window's layout beside the docked dashboard: a readable chat, a folding sidebar, nothing widening the window."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QApplication, QToolButton

from widgets.chat.panel import CHAT_MIN_WIDTH


@pytest.fixture
def docked(qtbot, make_window):
    """build(width, height) -> a window (no model) with the dashboard installed and docked at that size."""

    def build(width: int = 1280, height: int = 800):
        window = make_window(load=False)
        window.add_dashboard()
        window.resize(width, height)
        window.dashboard_dock.show()
        settle(qtbot)
        return window

    return build


def settle(qtbot) -> None:
    for _ in range(3):  # layouts settle over a few passes of the event loop (docks, splitters, word wrap)
        QApplication.processEvents()
        qtbot.wait(10)


def right_edge_in(widget, window) -> int:
    return widget.mapTo(window, QPoint(widget.width(), 0)).x()


def test_the_chat_keeps_a_readable_width_beside_the_docked_dashboard(docked) -> None:
    window = docked(1280, 800)
    panel = window.tabs.current.panel
    conversation = panel.splitter.widget(0)
    assert window.width() == 1280
    assert conversation.width() >= CHAT_MIN_WIDTH
    assert panel.input.width() >= CHAT_MIN_WIDTH - 140  # the message box beside Send, not a sliver
    assert window.dashboard_dock.width() >= 400


def test_nothing_falls_outside_a_900_by_600_window(qtbot, docked) -> None:
    window = docked(900, 600)
    assert window.minimumSizeHint().width() <= 900 and window.minimumSizeHint().height() <= 600
    assert (window.width(), window.height()) == (900, 600)
    assert window.tabs.current.panel.splitter.widget(0).width() >= CHAT_MIN_WIDTH
    export = next(b for b in window.dashboard.findChildren(QToolButton) if b.text() == "Export")
    assert right_edge_in(export, window) <= window.width()
    numbers = window.dashboard.numbers
    assert numbers.width() <= window.dashboard_dock.width()
    assert numbers.columns < 3  # fewer columns in the narrow dock, not a third one cut off
    for value in numbers.values.values():
        assert value.geometry().right() <= numbers.width()


def test_the_empty_chats_hint_wraps_instead_of_being_clipped(docked) -> None:
    window = docked(900, 600)
    transcript = window.tabs.current.panel.transcript
    hint = transcript._placeholder
    assert hint.isVisible() and hint.wordWrap()
    assert hint.width() <= transcript.viewport().width()
    assert hint.heightForWidth(hint.width()) >= hint.fontMetrics().lineSpacing()


def test_long_status_and_notice_texts_do_not_widen_the_window(qtbot, docked) -> None:
    window = docked(1200, 780)
    window.status.model.setText("Converting " + "a-very-long-model-name/" * 30)
    window.notice.show_message("Could not reach https://huggingface.co/" + "org/repo-" * 60 + " (timed out)", "error")
    window.tabs.current.panel.show_error("the engine said " + "x" * 400)
    settle(qtbot)
    assert window.width() == 1200
    assert window.minimumSizeHint().width() <= 900
    assert window.status.model.elided and "a-very-long-model-name" in window.status.model.text()
    assert window.notice.text.startswith("Could not reach https://huggingface.co/org/repo-")  # the text as given


def test_the_sidebar_folds_away_when_the_chat_would_get_too_narrow_and_opens_over_it(qtbot, docked) -> None:
    window = docked(1280, 800)
    panel = window.tabs.current.panel
    assert panel.sampling.isHidden() and panel.sidebar_squeezed  # 480 + the sidebar do not fit beside the dock
    window.dashboard_dock.hide()
    settle(qtbot)
    assert panel.sampling.isVisible() and not panel.sidebar_squeezed
    window.dashboard_dock.show()
    settle(qtbot)
    assert panel.sampling.isHidden()
    qtbot.mouseClick(panel.settings_button, Qt.MouseButton.LeftButton)  # no room: the settings open over the chat
    popup = panel._popup
    assert popup is not None and popup.isVisible() and panel.sampling.isVisible()
    popup.hide()
    settle(qtbot)
    assert panel.sampling.parent() is panel.splitter and panel.sampling.isHidden()


def test_the_sidebar_toggle_is_remembered(qtbot, make_window) -> None:
    window = make_window(load=False)
    window.resize(1200, 780)
    settle(qtbot)
    panel = window.tabs.current.panel
    assert panel.sampling.isVisible()
    qtbot.mouseClick(panel.settings_button, Qt.MouseButton.LeftButton)
    assert panel.sampling.isHidden() and not window.actions.settings_panel.isChecked()
    window.tabs.new_chat()
    assert window.tabs.current.panel.sampling.isHidden()  # every tab follows
    window.close()
    again = make_window(load=False)
    assert not again.settings.settings_panel_visible and again.tabs.current.panel.sampling.isHidden()


def test_the_sidebar_width_is_remembered(qtbot, make_window) -> None:
    window = make_window(load=False)
    window.resize(1200, 780)
    settle(qtbot)
    panel = window.tabs.current.panel
    handle = panel.splitter.handle(1)
    start = handle.rect().center()
    qtbot.mousePress(handle, Qt.MouseButton.LeftButton, pos=start)
    qtbot.mouseMove(handle, start - QPoint(80, 0))
    qtbot.mouseRelease(handle, Qt.MouseButton.LeftButton, pos=start - QPoint(80, 0))
    settle(qtbot)
    width = panel.splitter.sizes()[1]
    assert width > 300
    window.tabs.new_chat()
    settle(qtbot)
    assert abs(window.tabs.current.panel.splitter.sizes()[1] - width) <= 2
    window.close()
    again = make_window(load=False)
    again.resize(1200, 780)
    settle(qtbot)
    assert abs(again.tabs.current.panel.splitter.sizes()[1] - width) <= 2


def test_at_font_size_14_the_chat_with_selector_stays_in_the_toolbar(qtbot, make_window) -> None:
    from app.window.theme import ThemeManager

    app = QApplication.instance()
    font, sheet, palette = app.font(), app.styleSheet(), app.palette()
    try:
        ThemeManager(app).set("light", 14)
        window = make_window(load=False)
        window.resize(1200, 780)
        settle(qtbot)
        picker = window.remote.picker
        assert picker.isVisible()
        assert right_edge_in(picker, window.toolbar) <= window.toolbar.width()
    finally:
        app.setFont(font)
        app.setStyleSheet(sheet)
        app.setPalette(palette)
