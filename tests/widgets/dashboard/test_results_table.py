"""The wrapping results table: widths shared like an HTML table's, height that follows width, and its text."""

from __future__ import annotations

import pytest

from widgets.dashboard.results_table import ResultsTable, column_widths


def test_columns_share_the_width_like_an_html_table() -> None:
    assert column_widths([100, 100], [50, 50], 300) == [150, 150]  # all fit: spare width in proportion
    assert column_widths([100, 200], [50, 50], 200) == [75, 125]  # longest words, then the rest by what each wants
    # too narrow for every longest word: the short ones stay whole, the long ones break inside a word
    assert column_widths([100, 100, 300], [70, 30, 130], 180) == [70, 30, 80]
    assert sum(column_widths([300, 300], [200, 200], 100)) == pytest.approx(100)


def test_the_table_wraps_to_any_width_and_grows_in_height_instead(qtbot) -> None:
    table = ResultsTable()
    qtbot.addWidget(table)
    rows = [["64 tokens", "13 need 52 of 48 pages: 2 preemptions"], ["128 tokens", "7 need 56 of 48 pages: 15"]]
    table.set_table(["chat length", "one more"], rows)
    assert table.cells() == rows and table.columns() == ["chat length", "one more"]
    assert table.minimumSizeHint().width() < 100  # never forces a dock to scroll sideways
    wide, narrow = table.heightForWidth(800), table.heightForWidth(160)
    assert narrow > wide > 0
    table.resize(160, narrow)
    table.show()
    assert table.grab().width() == 160
    assert table.as_text().splitlines()[1] == "64 tokens\t13 need 52 of 48 pages: 2 preemptions"
    table.clear()
    assert table.cells() == [] and table.heightForWidth(160) == 0
