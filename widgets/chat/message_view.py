"""MessageView: one message of a transcript: role, Markdown body with code blocks (a finished reply that is wholly
JSON shows pretty-printed), stats, inline error, actions, and the reply token by token where probabilities came."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextEdit, QToolButton, QVBoxLayout, QWidget

from engine.domain.chat import USER, ChatMessage, format_stats
from widgets.chat.code_block import CodeBlockView
from widgets.chat.markdown_blocks import Segment, SegmentKind, split_markdown
from widgets.chat.prose_view import ProseView
from widgets.tokens.data import TokenEntry
from widgets.tokens.token_view import TokenView


def pretty_json(text: str) -> str | None:
    """A reply that is wholly one JSON object or array, indented two spaces; None for anything else."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    return json.dumps(value, indent=2, ensure_ascii=False) if isinstance(value, dict | list) else None


class ReplyTokenView(TokenView):
    """A TokenView inside a message: as tall as its text (the transcript scrolls, not the view)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)

    def _fit_height(self, *_args) -> None:
        height = int(self.document().size().height()) + self.frameWidth() * 2 + 2
        if self.height() != height:
            self.setFixedHeight(height)

    def wheelEvent(self, event) -> None:
        event.ignore()  # the transcript scrolls


# A streaming reply is shown at most this often. Appending to its open paragraph is cheap now (ProseView lays out only
# that paragraph, and asks for a layout pass only when its height changes), so this only keeps several streaming
# tabs from each painting at every 16 ms frame; 30 updates a second still read as a smooth stream.
STREAM_RENDER_MS = 33
# an update this close to its turn is shown now: the pump's frames come every STREAM_RENDER_MS give or take a little,
# and a timer for the last millisecond would wake the UI thread once more per frame for nothing
STREAM_RENDER_EARLY_MS = 8


class MessageView(QFrame):
    edit_requested = Signal()
    regenerate_requested = Signal()

    def __init__(self, message: ChatMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self._text = ""
        self._shown: str | None = None  # what the body shows (behind _text while a paced update waits)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.timeout.connect(self._render_streaming)
        self._rendered_at = -1.0  # time.monotonic() of the last streaming render
        is_user = message.role == USER
        self.setObjectName("userMessage" if is_user else "assistantMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel)

        header = self._header("You" if is_user else "Assistant")
        self._body = QVBoxLayout()
        self._body.setContentsMargins(0, 0, 0, 0)
        self._body.setSpacing(6)
        self._blocks: list[tuple[str, QWidget]] = []
        self._tokens: list[TokenEntry] = []  # this reply's tokens with probabilities, while the chat is open
        self.token_view: ReplyTokenView | None = None  # made when first shown
        self._build_footer_labels()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addLayout(self._body)
        self._token_slot = QVBoxLayout()
        self._token_slot.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self._token_slot)
        layout.addWidget(self.error_label)
        layout.addWidget(self.stats_label)
        # only now that the buttons have a parent: showing a parentless widget would open it as a window
        self.edit_button.setVisible(is_user)
        self.regenerate_button.setVisible(False)
        self.tokens_button.setVisible(False)
        self.set_message(message)

    def _header(self, role: str) -> QHBoxLayout:
        """The role, the status while streaming, and the message's buttons."""
        self._role = QLabel(role)
        self._role.setObjectName("role")
        self._status = QLabel()
        self._status.setTextFormat(Qt.TextFormat.PlainText)
        self._status.setObjectName("messageStatus")
        self.copy_button = self._tool("Copy", "Copy the whole message as Markdown", self._copy)
        self.edit_button = self._tool("Edit", "Edit this message and resend the chat from here", self.edit_requested)
        self.regenerate_button = self._tool("Regenerate", "Generate this reply again", self.regenerate_requested)
        self.tokens_button = self._tool(
            "Tokens", "Show this reply token by token: hover a token for its probability and alternatives", None
        )
        self.tokens_button.setCheckable(True)
        self.tokens_button.toggled.connect(self.show_tokens)
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self._role)
        header.addWidget(self._status)
        header.addStretch(1)
        for button in (self.tokens_button, self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(button)
        return header

    def _build_footer_labels(self) -> None:
        self.error_label = QLabel()
        self.error_label.setObjectName("inlineError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextFormat(Qt.TextFormat.PlainText)  # an error may quote the model's or a server's text
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("stats")
        self.stats_label.setTextFormat(Qt.TextFormat.PlainText)
        self.stats_label.setWordWrap(True)  # a narrow chat wraps the figures instead of cutting off the last

    def _tool(self, text: str, tip: str, target) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        if target is not None:
            button.clicked.connect(target)
        return button

    # ---- content ----------------------------------------------------------------------------
    def set_message(self, message: ChatMessage) -> None:
        """Show a message whole: its text, error and stats."""
        self.message = message
        self.set_content(message.content)
        self.error_label.setText(message.error or "")
        self.error_label.setVisible(bool(message.error))
        stats = format_stats(message) if message.role != USER else ""
        self.stats_label.setText(stats)
        self.stats_label.setVisible(bool(stats))

    def set_streaming_content(self, text: str) -> None:
        """The reply so far: shown now if it was not in the last STREAM_RENDER_MS, else when that time is up
        (`text` is the newest at once). A reply in a tab that is not shown waits until the tab is. The timer runs only
        while an update waits: one that ran after every render woke the UI thread between frames with nothing to
        show."""
        self._text = text
        if self._render_timer.isActive():
            return
        if self.window().isVisible() and not self.isVisible():
            return  # a background tab: showEvent catches up, once
        wait_ms = STREAM_RENDER_MS - (time.monotonic() - self._rendered_at) * 1000
        if wait_ms > STREAM_RENDER_EARLY_MS:
            self._render_timer.start(math.ceil(wait_ms))  # it shows what came meanwhile
            return
        self._render_streaming()

    def _render_streaming(self) -> None:
        if self._shown != self._text:
            self.set_content(self._text, streaming=True)
            self._rendered_at = time.monotonic()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._shown != self._text and self.message.finish_reason is None:
            self._render_streaming()

    def set_content(self, text: str, streaming: bool = False) -> None:
        """Update the body in place; only blocks whose text changed are touched, so streaming never flickers. While
        streaming, the last prose block grows by appending; a finished message renders each block whole, once."""
        self._text = self._shown = text
        segments = self._segments(text)
        for index, segment in enumerate(segments):
            growing = streaming and index == len(segments) - 1
            if index < len(self._blocks) and self._blocks[index][0] == segment.kind:
                self._update_block(self._blocks[index][1], segment, growing)
                continue
            self._truncate_blocks(index)
            self._add_block(segment, growing)
        self._truncate_blocks(len(segments))

    def _segments(self, text: str) -> list[Segment]:
        if self.message.role == USER:
            return [Segment(SegmentKind.PLAIN, text)]
        if self.message.finish_reason is not None:  # finished: a JSON reply reads better indented (not mid-stream)
            pretty = pretty_json(text)
            if pretty is not None:
                return [Segment(SegmentKind.CODE, pretty, "json")]
        return split_markdown(text)

    def _add_block(self, segment: Segment, growing: bool = False) -> None:
        widget: QWidget = CodeBlockView() if segment.kind is SegmentKind.CODE else ProseView()
        self._update_block(widget, segment, growing)
        self._blocks.append((segment.kind, widget))
        self._body.addWidget(widget)
        if self.tokens_button.isChecked():
            widget.setVisible(False)

    @staticmethod
    def _update_block(widget: QWidget, segment: Segment, growing: bool) -> None:
        if isinstance(widget, CodeBlockView):
            widget.set_text(segment.text, segment.language)
        elif isinstance(widget, ProseView):
            if segment.kind is SegmentKind.PLAIN:
                widget.set_plain(segment.text)
            elif growing:
                widget.stream_markdown(segment.text)
            elif widget.source != segment.text or widget.streamed:
                widget.set_markdown(segment.text)

    def _truncate_blocks(self, keep: int) -> None:
        while len(self._blocks) > keep:
            _kind, widget = self._blocks.pop()
            self._body.removeWidget(widget)
            widget.deleteLater()

    @property
    def text(self) -> str:
        return self._text

    @property
    def code_views(self) -> list[CodeBlockView]:
        return [w for _k, w in self._blocks if isinstance(w, CodeBlockView)]

    @property
    def prose_views(self) -> list[ProseView]:
        return [w for _k, w in self._blocks if isinstance(w, ProseView)]

    # ---- tokens -----------------------------------------------------------------------------
    @property
    def tokens(self) -> list[TokenEntry]:
        return list(self._tokens)

    def append_tokens(self, entries: Sequence[TokenEntry]) -> None:
        """More of this reply's tokens (as they stream); the Tokens button shows once there are any."""
        if not entries:
            return
        self._tokens.extend(entries)
        if self.token_view is not None:
            self.token_view.append_entries(entries)
        self.tokens_button.setVisible(True)

    def show_tokens(self, shown: bool) -> None:
        """Swap the body for the token view (or back)."""
        if shown and self.token_view is None:
            self.token_view = ReplyTokenView()
            self.token_view.set_entries(self._tokens)
            self._token_slot.addWidget(self.token_view)
        if self.tokens_button.isChecked() != shown:
            self.tokens_button.setChecked(shown)  # comes back here once, with nothing left to do
            return
        for _kind, widget in self._blocks:
            widget.setVisible(not shown)
        if self.token_view is not None:
            self.token_view.setVisible(shown)

    # ---- state ------------------------------------------------------------------------------
    def set_status(self, text: str) -> None:
        self._status.setText(text)

    def set_actions(self, *, can_edit: bool, can_regenerate: bool) -> None:
        self.edit_button.setEnabled(can_edit)
        self.regenerate_button.setVisible(can_regenerate and self.message.role != USER)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self._text)
        self.copy_button.setText("Copied")
        QTimer.singleShot(1200, self.copy_button, lambda: self.copy_button.setText("Copy"))  # dies with the button
