"""The token view: tokens inline with hover details (probabilities and alternatives when known), diff marks; the
plain-data side: entries, words, the diff."""

from __future__ import annotations

import math

import pytest
from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from widgets.tokens.data import Alternative, TokenEntry, describe, diff_flags, split_words
from widgets.tokens.token_view import TokenView


@pytest.fixture
def view(qtbot) -> TokenView:
    widget = TokenView()
    qtbot.addWidget(widget)
    widget.resize(400, 200)
    widget.show()
    return widget


def test_entries_stream_in_and_read_as_the_text(view) -> None:
    view.append_entries([TokenEntry("The", token_ids=(1,)), TokenEntry(" sky", token_ids=(2,))])
    view.append_entries([TokenEntry(" is", token_ids=(3,)), TokenEntry(" blue.", token_ids=(4, 5))])
    assert view.toPlainText() == "The sky is blue."
    assert [e.text for e in view.entries] == ["The", " sky", " is", " blue."]


def test_hovering_a_token_names_it_and_where_known_its_probability_and_alternatives(view) -> None:
    sure = TokenEntry(
        " Paris", logprob=math.log(0.83), alternatives=(Alternative(" Lyon", math.log(0.1)),), token_ids=(7,)
    )
    view.set_entries([TokenEntry("Capital:", token_ids=(6,)), sure])
    cursor = view.textCursor()
    cursor.setPosition(len("Capital:") + 2)  # inside " Paris"
    point = view.cursorRect(cursor).center()  # in the viewport; nothing is scrolled
    assert view.entry_at(point) == 1
    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.Type.ToolTip, point, view.viewport().mapToGlobal(point)))
    tip = QToolTip.text()
    assert "“ Paris”" in tip and "probability 83.0%" in tip and "or “ Lyon”: 10.0%" in tip
    assert view.entry_at(QPoint(390, 190)) is None  # below the text
    assert "no probabilities reported for this token" in describe(TokenEntry("x", token_ids=(1,)))


def test_marks_colour_only_the_tokens_that_differ(view) -> None:
    view.set_entries([TokenEntry(t) for t in ("a", "b", "c")], [False, True, False])
    assert view.marked == [False, True, False]
    cursor = view.textCursor()
    cursor.setPosition(2)  # inside "b"
    assert cursor.charFormat().fontUnderline()
    view.set_marked([False, False, True])
    cursor.setPosition(2)
    assert not cursor.charFormat().fontUnderline()
    assert "differs from the reply" in view.tooltip_for(2)


def test_words_and_the_diff() -> None:
    words = split_words("The sky  is\nblue.")
    assert [w.text for w in words] == ["The", " sky", "  is", "\nblue."] and all(w.kind == "word" for w in words)
    assert "".join(w.text for w in words) == "The sky  is\nblue."
    a, b = diff_flags(["the", "sky", "is", "blue"], ["the", "sky", "looks", "blue", "today"])
    assert a == [False, False, True, False] and b == [False, False, True, False, True]
    assert TokenEntry("x", token_ids=(4, 5)).unit == (4, 5) and TokenEntry("x").unit == "x"
