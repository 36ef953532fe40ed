"""ProseView: a message's text in one QTextDocument: Markdown rendered from a safe subset, a streaming reply appended
where it grows (only its last paragraph is laid out again), its height cached per width, links opened only after the
user confirms."""

from __future__ import annotations

import math
from collections.abc import Callable

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import (
    QDesktopServices,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
)
from PySide6.QtWidgets import QFrame, QMessageBox, QSizePolicy, QTextBrowser, QWidget

from widgets.chat.safe_markdown import is_safe_link, to_html

#: asks the user whether to open a link; the tests and the benchmark replace it
ConfirmLink = Callable[[QWidget, str], bool]


def ask_before_opening(parent: QWidget, url: str) -> bool:
    answer = QMessageBox.question(
        parent,
        "Open link",
        f"Open this link in your web browser?\n\n{url}\n\nIt was written by the model (or the chat you imported): "
        "make sure you trust where it goes.",
    )
    return answer == QMessageBox.StandardButton.Yes


def closed_length(text: str) -> int:
    """How much of a streaming paragraph run is finished: everything up to its last blank line."""
    end = text.rfind("\n\n")
    return 0 if end < 0 else end + 2


class SafeDocument(QTextDocument):
    """A document that loads nothing: Qt's own would read a local file named by an image (`<img src=/etc/...>`).
    It keeps no undo history: a message is never edited in place (QTextBrowser's own document keeps none either)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setUndoRedoEnabled(False)

    def loadResource(self, kind: int, name: QUrl):
        return None


class ProseView(QTextBrowser):
    """Read-only, selectable, as tall as its text (the transcript scrolls, not the view). `set_markdown` renders the
    whole text; `stream_markdown` is for a reply that grows: finished paragraphs are rendered once, the open one is
    shown as it arrives (plain) and appended to, never re-set."""

    link_opened = Signal(str)
    confirm_link: ConfirmLink = staticmethod(ask_before_opening)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setDocument(SafeDocument(self))
        self.setObjectName("prose")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setLineWrapMode(QTextBrowser.LineWrapMode.WidgetWidth)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse
            | Qt.TextInteractionFlag.LinksAccessibleByMouse
            | Qt.TextInteractionFlag.LinksAccessibleByKeyboard
        )
        policy = QSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(0)
        self.anchorClicked.connect(self._open)
        self.document().contentsChanged.connect(self._heights_changed)
        self._heights: dict[int, int] = {}
        self._source = ""  # the text shown, whole
        self._rendered = ""  # its leading part shown as rendered Markdown (streaming)
        self._tail_start = 0  # where the plain, still-open part begins in the document (streaming)
        self._shown_height = -1
        self._pieces = 0  # rendered pieces in the document: more than one when paragraphs were appended as they ended
        self.document().documentLayout().documentSizeChanged.connect(self._size_changed)

    # ---- content ----------------------------------------------------------------------------
    @property
    def source(self) -> str:
        return self._source

    @property
    def streamed(self) -> bool:
        """Part of the text is shown plain, or rendered paragraph by paragraph: a whole render would differ."""
        return self._rendered != self._source or self._pieces > 1

    def set_plain(self, text: str) -> None:
        """Text shown exactly as written (a user's message)."""
        if text != self._source:
            self._source, self._rendered, self._pieces = text, "", 0
            self.setPlainText(text)
            self._tail_start = self.document().characterCount()

    def set_markdown(self, text: str) -> None:
        """The whole text rendered (a finished message)."""
        self._source = self._rendered = text
        self.setHtml(to_html(text))
        self._tail_start = self.document().characterCount() - 1
        self._pieces = 1

    def stream_markdown(self, text: str) -> None:
        """The reply so far. Paragraphs that ended (a blank line followed) are rendered once, each appended where the
        document ends; the open paragraph is plain text, appended to as it grows."""
        if text == self._source:
            return
        if not text.startswith(self._rendered) or not self._source.startswith(self._rendered):
            self._restart(text)
            return
        cursor = QTextCursor(self.document())
        # one edit: the document is laid out once, when it ends; each cursor move outside an edit lays the open
        # paragraph out to place the cursor (half of an update's time with a paragraph of a few hundred words)
        cursor.beginEditBlock()
        try:
            self._append_streamed(cursor, text)
        finally:
            cursor.endEditBlock()

    def _append_streamed(self, cursor: QTextCursor, text: str) -> None:
        closed = closed_length(text)
        if closed > len(self._rendered):
            self._cut_tail(cursor)
            fragment = QTextDocumentFragment.fromHtml(to_html(text[len(self._rendered) : closed]))
            cursor.movePosition(QTextCursor.MoveOperation.End)
            if self._rendered:
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            cursor.insertFragment(fragment)
            self._pieces += 1
            self._rendered = text[:closed]
            self._source = self._rendered
            self._start_tail(cursor)
        tail, shown = text[len(self._rendered) :], self._source[len(self._rendered) :]
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if tail.startswith(shown):
            cursor.insertText(tail[len(shown) :])
        else:
            self._cut_tail(cursor)
            self._start_tail(cursor)
            cursor.insertText(tail)
        self._source = text

    def _restart(self, text: str) -> None:
        closed = closed_length(text)
        if closed:
            self.set_markdown(text[:closed])
        else:
            self.clear()
        cursor = QTextCursor(self.document())
        self._start_tail(cursor)
        cursor.insertText(text[closed:])
        self._source = text

    def _start_tail(self, cursor: QTextCursor) -> None:
        """The open paragraph begins in a block of its own, in the plain format (not the last rendered one's)."""
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if self._rendered:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        else:
            cursor.setBlockFormat(QTextBlockFormat())
            cursor.setCharFormat(QTextCharFormat())
        self._tail_start = cursor.position()

    def _cut_tail(self, cursor: QTextCursor) -> None:
        """Remove the plain open part, and the block break before it."""
        start = max(0, self._tail_start - (1 if self._rendered else 0))
        cursor.setPosition(start)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        self._source = self._rendered

    def clear(self) -> None:
        super().clear()
        self._source = self._rendered = ""
        self._tail_start = self._pieces = 0

    # ---- links ------------------------------------------------------------------------------
    def loadResource(self, kind: int, name: QUrl):
        return None  # nothing is ever loaded for a message: no local file, no remote image

    def _open(self, url: QUrl) -> None:
        target = url.toString()
        if is_safe_link(target) and type(self).confirm_link(self, target):
            QDesktopServices.openUrl(url)
            self.link_opened.emit(target)

    # ---- size -------------------------------------------------------------------------------
    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        """The text's height at `width`, from the laid-out document when that is its width, else measured once on
        a copy and remembered until the text changes (the transcript asks often, for every message)."""
        height = self._heights.get(width)
        if height is None:
            document = self.document()
            if abs(document.textWidth() - width) < 0.5:
                height = math.ceil(document.size().height())
            else:
                copy = document.clone()
                copy.setTextWidth(width)
                height = math.ceil(copy.size().height())
            self._heights[width] = height
        return height

    def sizeHint(self) -> QSize:
        width = max(1, self.width())
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        return QSize(0, 0)

    def _heights_changed(self) -> None:
        self._heights.clear()

    def _size_changed(self, size) -> None:
        height = math.ceil(size.height())
        if height != self._shown_height:  # a token that stays on its line changes no geometry: no layout pass
            self._shown_height = height
            self.updateGeometry()

    def keyPressEvent(self, event) -> None:
        text = event.text()
        if text and text.isprintable() and not event.modifiers() & ~Qt.KeyboardModifier.ShiftModifier:
            event.ignore()  # typing, Space included (a read-only view would scroll): the chat's message box takes it
            return
        super().keyPressEvent(event)

    def wheelEvent(self, event) -> None:
        event.ignore()  # the transcript scrolls
