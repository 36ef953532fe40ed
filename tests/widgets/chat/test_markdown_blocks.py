"""Splitting Markdown into prose and fenced code, including a fence still streaming in."""

from __future__ import annotations

from widgets.chat.markdown_blocks import Segment, code_blocks, split_markdown


def test_prose_and_code_alternate() -> None:
    text = "Here is code:\n\n```python\ndef f():\n    return 1\n```\n\nAnd **more** text."
    assert split_markdown(text) == [
        Segment("prose", "Here is code:\n"),
        Segment("code", "def f():\n    return 1", "python"),
        Segment("prose", "\nAnd **more** text."),
    ]


def test_an_unclosed_fence_is_code_to_the_end() -> None:
    segments = split_markdown("Look:\n~~~\nx = 1\ny = 2")
    assert segments[-1] == Segment("code", "x = 1\ny = 2", "", closed=False)


def test_a_shorter_or_different_fence_does_not_close_a_block() -> None:
    text = "````md\n```python\nprint()\n```\n````"
    assert code_blocks(text) == ["```python\nprint()\n```"]
    assert code_blocks("```\na\n~~~\nb\n```") == ["a\n~~~\nb"]


def test_inline_backticks_are_prose() -> None:
    assert split_markdown("use `x` and ``y``") == [Segment("prose", "use `x` and ``y``")]
    assert split_markdown("") == []
