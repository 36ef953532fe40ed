"""What keeps streaming cheap for the UI thread: the growing paragraph is appended to (never re-set), a layout pass
happens only when a reply grows by a line, heights are measured once per width, a hidden tab waits until shown."""

from __future__ import annotations

from PySide6.QtWidgets import QTabWidget

from engine.domain.chat import ASSISTANT, USER, ChatMessage
from engine.types import FinishReason
from widgets.chat.code_block import CodeBlockView
from widgets.chat.message_view import MessageView
from widgets.chat.prose_view import ProseView, SafeDocument
from widgets.chat.transcript_view import TranscriptView
from widgets.tokens.data import TokenEntry

WORDS = [f"word{i}" for i in range(60)]


def test_a_growing_paragraph_is_appended_to_not_set_again(qtbot) -> None:
    view = ProseView()
    qtbot.addWidget(view)
    view.resize(400, 100)
    view.show()
    changes: list[tuple[int, int, int]] = []
    view.stream_markdown("Intro **bold**.\n\nThe open paragraph")
    view.document().contentsChange.connect(lambda pos, removed, added: changes.append((pos, removed, added)))
    before = view.document().characterCount()
    view.stream_markdown("Intro **bold**.\n\nThe open paragraph grows")
    assert changes == [(before - 1, 0, len(" grows"))]  # inserted where the document ends; nothing removed
    assert "bold" in view.toPlainText() and "**" not in view.toPlainText()  # the closed paragraph was rendered


def test_a_closed_paragraph_is_rendered_once_and_the_rest_is_left_alone(qtbot) -> None:
    view = ProseView()
    qtbot.addWidget(view)
    view.stream_markdown("First *para*.\n\nSecond")
    rendered_end = view._tail_start
    changes: list[int] = []
    view.document().contentsChange.connect(lambda pos, removed, added: changes.append(pos))
    view.stream_markdown("First *para*.\n\nSecond **one**.\n\nThird")
    assert changes and min(changes) >= rendered_end - 1  # the first paragraph was not touched
    assert view.toPlainText().split("\n")[:2] == ["First para.", "Second one."]


def test_an_update_is_one_edit_of_the_document_and_keeps_no_undo_history(qtbot) -> None:
    view = ProseView()
    qtbot.addWidget(view)
    view.resize(400, 100)
    view.show()
    view.stream_markdown("First *para*.\n\nSecond")
    changes: list[int] = []
    view.document().contentsChange.connect(lambda pos, removed, added: changes.append(pos))
    # the open paragraph cut, the closed one rendered in its place, a new open one begun and written: one edit, so
    # the layout and the height cache hear of it once
    view.stream_markdown("First *para*.\n\nSecond **one**.\n\nThird")
    assert len(changes) == 1
    assert view.toPlainText().split("\n") == ["First para.", "Second one.", "Third"]
    assert not view.document().isUndoRedoEnabled() and view.document().availableUndoSteps() == 0


def test_a_streaming_code_block_is_appended_to_and_keeps_no_undo_history(qtbot) -> None:
    view = CodeBlockView("def f():\n", "python")
    qtbot.addWidget(view)
    changes: list[tuple[int, int, int]] = []
    view.editor.document().contentsChange.connect(lambda pos, removed, added: changes.append((pos, removed, added)))
    for line in ["    a = 1\n", "    return a\n"]:
        view.set_text(view.text + line, "python")
    assert view.text == "def f():\n    a = 1\n    return a\n"
    assert [removed for _pos, removed, _added in changes] == [0, 0]  # appended where it ended, never re-set
    assert view.editor.document().availableUndoSteps() == 0


def test_the_transcript_is_laid_out_only_when_a_reply_grows_by_a_line(qtbot, monkeypatch) -> None:
    transcript = TranscriptView()
    qtbot.addWidget(transcript)
    transcript.resize(700, 500)
    transcript.show()
    transcript.append_message(ChatMessage(ASSISTANT, ""))
    view = transcript.views[-1]
    qtbot.wait(50)
    fits: list[int] = []
    real = TranscriptView._fit_page
    monkeypatch.setattr(TranscriptView, "_fit_page", lambda self: (fits.append(1), real(self)))
    for count in range(1, len(WORDS) + 1):
        view.set_content(" ".join(WORDS[:count]), streaming=True)
        qtbot.wait(1)  # the layout request of this update, if any, is handled now
    assert 0 < len(fits) < len(WORDS) // 3, len(fits)  # a handful of new lines, not one pass per word


def test_heights_are_measured_once_per_width_until_the_text_changes(qtbot, monkeypatch) -> None:
    view = ProseView()
    qtbot.addWidget(view)
    view.set_markdown("A paragraph long enough to wrap at a narrow width. " * 6)
    clones: list[int] = []
    real = SafeDocument.clone
    monkeypatch.setattr(SafeDocument, "clone", lambda self, *a: (clones.append(1), real(self, *a))[1])
    first = view.heightForWidth(180)
    assert view.heightForWidth(180) == first and view.heightForWidth(180) == first
    assert len(clones) == 1 and view.heightForWidth(600) < first and len(clones) == 2
    view.set_markdown("Short.")
    assert view.heightForWidth(180) < first and len(clones) == 3


def test_a_reply_in_a_background_tab_is_shown_when_its_tab_is(qtbot) -> None:
    """A background tab builds no widgets for its messages: they are made, showing what came meanwhile (the reply
    so far, its status, its tokens), when the tab is shown."""
    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    front, back = TranscriptView(), TranscriptView()
    tabs.addTab(front, "front")
    tabs.addTab(back, "back")
    tabs.resize(600, 400)
    tabs.show()
    back.append_message(ChatMessage(USER, "Hello"))
    back.append_message(ChatMessage(ASSISTANT, ""))
    back.set_status(1, "writing…")
    back.set_streaming_text(1, "Written while")
    back.set_streaming_text(1, "Written while nobody looks")
    back.append_tokens(1, [TokenEntry("Written", -0.1)])
    assert back.count == 2 and back.findChildren(MessageView) == []  # nothing built, nothing laid out unseen
    tabs.setCurrentIndex(1)
    views = back.findChildren(MessageView)
    assert len(views) == 2 and back.views[1] is views[1]
    view = views[1]
    assert view.text == "Written while nobody looks" and view.tokens == [TokenEntry("Written", -0.1)]
    assert view._status.text() == "writing…"
    qtbot.waitUntil(lambda: bool(view.prose_views) and view.prose_views[0].toPlainText() == view.text, timeout=2000)
    back.set_streaming_text(1, "Written while nobody looks, then seen")  # built now: straight to its view
    assert view.text.endswith("then seen")


def test_a_background_tabs_messages_are_built_when_asked_for(qtbot) -> None:
    transcript = TranscriptView()
    qtbot.addWidget(transcript)
    transcript.append_message(ChatMessage(USER, "one"))
    transcript.append_message(ChatMessage(ASSISTANT, "two"))
    transcript.update_message(1, ChatMessage(ASSISTANT, "two, finished", finish_reason=FinishReason.STOP))
    transcript.truncate(1)
    assert transcript.count == 1 and transcript.findChildren(MessageView) == []
    assert [view.text for view in transcript.views] == ["one"]  # asked for: built
    transcript.append_message(ChatMessage(ASSISTANT, "three"))
    transcript.mark_dropped([0], "the context is full")  # kept for when the views are built
    assert len(transcript.findChildren(MessageView)) == 1
    assert transcript.dropped_markers  # asked for: built, and dimmed
    assert [view.text for view in transcript.findChildren(MessageView)] == ["one", "three"]
    assert transcript.views[0].property("dropped") and not transcript.views[1].property("dropped")


def test_a_finished_reply_is_rendered_whole_once(qtbot) -> None:
    transcript = TranscriptView()
    qtbot.addWidget(transcript)
    transcript.append_message(ChatMessage(ASSISTANT, ""))
    view = transcript.views[-1]
    text = "1. one\n\n2. two\n\nend"
    for end in range(1, len(text) + 1):
        view.set_content(text[:end], streaming=True)
    assert view.prose_views[0].streamed
    view.set_message(ChatMessage(ASSISTANT, text, finish_reason=FinishReason.STOP))
    prose = view.prose_views[0]
    assert not prose.streamed and prose.source == text
    lists = {prose.document().findBlockByNumber(i).textList() for i in range(2)}
    assert len(lists) == 1 and None not in lists  # a loose list is one list once the reply is whole
