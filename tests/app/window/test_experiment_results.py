"""The Experiment results panel in the docked dashboard of the real window: the table fits the dock's width, and a
new experiment never shows the last one's table under its heading."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractScrollArea

CAPACITY_COLUMNS = ["chat length", "pages each", "fit in 48", "that many", "one more"]
CAPACITY_ROWS = [
    ["64 tokens", "4", "12", "12 need 48 of 48 pages: no preemption", "13 need 52 of 48 pages: 2 preemptions"],
    ["128 tokens", "8", "6", "6 need 48 of 48 pages: no preemption", "7 need 56 of 48 pages: 15 preemptions"],
    ["256 tokens", "16", "3", "3 need 48 of 48 pages: no preemption", "4 need 64 of 48 pages: 51 preemptions"],
]


def sideways_scrolling(widget) -> list[str]:
    """The scroll areas in and around `widget` that have something to scroll sideways."""
    areas = widget.findChildren(QAbstractScrollArea)
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea):
            areas.append(parent)
        parent = parent.parentWidget()
    return [type(a).__name__ for a in areas if a.horizontalScrollBar().maximum() > 0]


def test_the_results_table_fits_the_docked_dashboard_without_scrolling_sideways(qtbot, make_window) -> None:
    window = make_window(load=False)
    window.resize(1280, 800)
    dashboard = window.add_dashboard()
    window.actions.dashboard.trigger()
    window.resizeDocks([window.dashboard_dock], [440], Qt.Orientation.Horizontal)
    dashboard.show_experiment_result(
        "Capacity: chats of growing length in one KV budget of 48 pages", CAPACITY_COLUMNS, CAPACITY_ROWS, ["a note"]
    )
    panel = dashboard.results
    qtbot.waitUntil(lambda: panel.isVisible() and panel.width() > 0, timeout=5_000)
    qtbot.wait(50)  # the layout settles
    assert window.dashboard_dock.width() <= 460
    assert sideways_scrolling(panel) == []
    assert panel.table.isVisible() and panel.table.width() <= panel.contentsRect().width()
    assert panel.table.height() >= panel.table.heightForWidth(panel.table.width())  # every wrapped row shows
    assert panel.cells() == CAPACITY_ROWS and panel.columns() == CAPACITY_COLUMNS
