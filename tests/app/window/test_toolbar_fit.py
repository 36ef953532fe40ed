"""At a large font the toolbar keeps its actions on screen (short labels, a slimmer selector) instead of dropping
Settings into a faint » menu; where the window is too narrow even for those, the overflow says "More"."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication, QToolButton

from app.window.toolbar_fit import EXTENSION


@pytest.fixture
def at_font_size(qtbot, make_window):
    """build(points, width, height) -> a window (no model) with the theme at that font size."""
    from app.window.theme import ThemeManager

    app = QApplication.instance()
    saved = app.font(), app.styleSheet(), app.palette()

    def build(points: int, width: int, height: int):
        ThemeManager(app).set("light", points)
        window = make_window(load=False)
        window.resize(width, height)
        settle(qtbot)
        return window

    yield build
    app.setFont(saved[0])
    app.setStyleSheet(saved[1])
    app.setPalette(saved[2])


def settle(qtbot) -> None:
    for _ in range(4):
        QApplication.processEvents()
        qtbot.wait(10)


def hidden_actions(window) -> list[str]:
    """The toolbar's actions whose buttons are not shown whole inside the toolbar (those went into the overflow)."""
    hidden = []
    for action in window.toolbar.actions():
        widget = window.toolbar.widgetForAction(action)
        if action.isSeparator() or widget is None:
            continue
        right = widget.mapTo(window.toolbar, widget.rect().topRight()).x()
        if not widget.isVisible() or right > window.toolbar.width():
            hidden.append(action.text() or type(widget).__name__)
    return hidden


def extension(window) -> QToolButton:
    return window.toolbar.findChild(QToolButton, EXTENSION)


@pytest.mark.parametrize("size", [(1200, 780), (900, 600)])
def test_at_16_pt_every_toolbar_action_stays_visible(qtbot, at_font_size, size) -> None:
    window = at_font_size(16, *size)
    assert hidden_actions(window) == []
    assert not extension(window).isVisible()
    settings = window.toolbar.widgetForAction(window.actions.settings)
    assert settings.text() == "Settings" and "Theme" in settings.toolTip()  # short label, the full story on hover
    assert window.actions.settings.text() == "&Settings…"  # the menu keeps the full name


def test_at_16_pt_a_window_too_narrow_for_all_says_more_plainly(qtbot, at_font_size) -> None:
    window = at_font_size(16, 480, 600)
    more = extension(window)
    assert hidden_actions(window) and more.isVisible()
    assert more.text() == "More" and "More toolbar actions" in more.toolTip()
    assert more.width() >= more.fontMetrics().horizontalAdvance("More")  # the label shows, not a 12-pixel »
    assert more.mapTo(window.toolbar, more.rect().topRight()).x() <= window.toolbar.width()
    window.resize(1200, 780)  # wide again: the overflow goes, every action is back
    settle(qtbot)
    assert hidden_actions(window) == [] and not more.isVisible()


def test_at_10_pt_the_toolbar_keeps_its_full_labels(qtbot, at_font_size) -> None:
    window = at_font_size(10, 1200, 780)
    assert hidden_actions(window) == []
    assert window.toolbar.widgetForAction(window.actions.regenerate).text() == "Regenerate reply"
    assert window.remote.picker.label.isVisible()
