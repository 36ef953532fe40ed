"""A model's reply (or an imported chat) is untrusted: its Markdown renders from a safe subset, checked on the rendered
documents' anchors and images, finished and while streaming."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QTextCursor, QTextFormat

from engine.domain.chat import ASSISTANT, ChatMessage
from engine.types import FinishReason
from widgets.chat import prose_view
from widgets.chat.message_view import MessageView
from widgets.chat.transcript_view import TranscriptView
from widgets.notice_bar import NoticeBar

HOSTILE = (
    "Read [https://python.org](smb://evil.example/s) first.\n\n"
    '<a href="file:///etc/passwd">passwords</a> and ![x](/local/file.png) and ![y](file:///home/me/secret.png)\n\n'
    '<span style="color:red">red</span> <script>alert(1)</script> <!-- a hidden comment -->\n\n'
    "A web link: [the docs](https://docs.python.org/3/) and <https://example.org/page>.\n\n"
    "Not a web link: [run](javascript:alert(1)) [mail](mailto:a@b.c)\n"
)


def anchors_and_images(view: MessageView) -> tuple[list[str], list[str]]:
    hrefs, images = [], []
    for prose in view.prose_views:
        block = prose.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fmt = it.fragment().charFormat()
                if fmt.isAnchor():
                    hrefs.append(fmt.anchorHref())
                if fmt.isImageFormat() or fmt.objectType() == QTextFormat.ObjectTypes.ImageObject:
                    images.append(fmt.toImageFormat().name())
                it += 1
            block = block.next()
    return hrefs, images


def shown_text(view: MessageView) -> str:
    return "\n".join(p.toPlainText() for p in view.prose_views)


def check_safe(view: MessageView) -> None:
    hrefs, images = anchors_and_images(view)
    assert images == []  # no image is ever put into the document, so none can be loaded
    assert hrefs and all(h.startswith(("http://", "https://")) for h in hrefs), hrefs
    text = shown_text(view)
    # what the model wrote stays visible as text: the fake link's real target, the HTML, the hidden comment
    assert "[https://python.org](smb://evil.example/s)" in text
    assert '<a href="file:///etc/passwd">passwords</a>' in text
    assert "![x](/local/file.png)" in text and "<script>alert(1)</script>" in text
    assert "<!-- a hidden comment -->" in text and '<span style="color:red">' in text
    assert "[run](javascript:alert(1))" in text


def test_a_finished_reply_renders_only_web_links_and_no_html_or_images(qtbot) -> None:
    view = MessageView(ChatMessage(ASSISTANT, HOSTILE, finish_reason=FinishReason.STOP))
    qtbot.addWidget(view)
    check_safe(view)
    hrefs, _ = anchors_and_images(view)
    assert set(hrefs) == {"https://docs.python.org/3/", "https://example.org/page"}
    # a link whose text is not its target shows the target beside it; one that is its own target does not repeat it
    assert "the docs (https://docs.python.org/3/)" in shown_text(view)
    assert "https://example.org/page (" not in shown_text(view)


def test_a_streaming_reply_is_just_as_safe_at_every_step(qtbot) -> None:
    transcript = TranscriptView()
    qtbot.addWidget(transcript)
    transcript.show()
    transcript.append_message(ChatMessage(ASSISTANT, ""))
    view = transcript.views[-1]
    for end in range(1, len(HOSTILE) + 1, 7):
        view.set_content(HOSTILE[:end], streaming=True)
        _hrefs, images = anchors_and_images(view)
        assert images == [] and all(h.startswith(("http://", "https://")) for h in _hrefs)
    view.set_content(HOSTILE, streaming=True)
    check_safe(view)
    view.set_message(ChatMessage(ASSISTANT, HOSTILE, finish_reason=FinishReason.STOP))
    check_safe(view)


def test_a_link_opens_only_after_the_user_confirms(qtbot, monkeypatch) -> None:
    opened: list[str] = []
    asked: list[str] = []
    monkeypatch.setattr(prose_view.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    answer = [False]
    monkeypatch.setattr(prose_view.ProseView, "confirm_link", lambda parent, url: asked.append(url) or answer[0])
    view = MessageView(ChatMessage(ASSISTANT, HOSTILE, finish_reason=FinishReason.STOP))
    qtbot.addWidget(view)
    prose = view.prose_views[0]
    prose.anchorClicked.emit(QUrl("https://docs.python.org/3/"))
    assert asked == ["https://docs.python.org/3/"] and opened == []  # declined: nothing opens
    answer[0] = True
    prose.anchorClicked.emit(QUrl("https://docs.python.org/3/"))
    assert opened == ["https://docs.python.org/3/"]
    prose.anchorClicked.emit(QUrl("smb://evil.example/s"))  # never offered, whatever emits it
    assert opened == ["https://docs.python.org/3/"] and len(asked) == 2


def test_no_resource_is_ever_loaded_for_a_message(qtbot) -> None:
    view = MessageView(ChatMessage(ASSISTANT, "text", finish_reason=FinishReason.STOP))
    qtbot.addWidget(view)
    prose = view.prose_views[0]
    assert prose.loadResource(2, QUrl("file:///etc/hostname")) is None
    cursor = QTextCursor(prose.document())
    cursor.insertHtml('<img src="file:///etc/hostname">')  # even HTML put in by hand does not load the file
    assert prose.document().resource(2, QUrl("file:///etc/hostname")) is None


@pytest.mark.parametrize("title", ['<b>bold</b><img src="file:///etc/passwd">', "<a href='smb://x'>chat</a>"])
def test_a_title_in_the_notice_bar_is_text(qtbot, title: str) -> None:
    bar = NoticeBar()
    qtbot.addWidget(bar)
    bar.show_message(f"Imported “{title}” from /tmp/chat.json.")
    assert bar.label.textFormat().name == "PlainText"
    assert title in bar.label.text().replace("\u200b", "")


def test_a_user_message_is_shown_exactly_as_typed(qtbot) -> None:
    view = MessageView(ChatMessage("user", "**not bold** <b>nor this</b> [x](https://a.b)"))
    qtbot.addWidget(view)
    hrefs, images = anchors_and_images(view)
    assert hrefs == [] and images == []
    assert shown_text(view) == "**not bold** <b>nor this</b> [x](https://a.b)"
