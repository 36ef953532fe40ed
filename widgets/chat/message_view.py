"""MessageView: one message of a transcript: role, Markdown body with code blocks, stats, inline error, actions."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from widgets.chat.code_block import CodeBlockView
from widgets.chat.data import USER, ChatMessage, format_stats
from widgets.chat.markdown_blocks import Segment, split_markdown


def _prose_label() -> QLabel:
    label = QLabel()
    label.setObjectName("prose")
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.MarkdownText)
    label.setTextInteractionFlags(
        Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse
    )
    label.setOpenExternalLinks(True)
    label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
    return label


class MessageView(QFrame):
    edit_requested = Signal()
    regenerate_requested = Signal()

    def __init__(self, message: ChatMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self._text = ""
        is_user = message.role == USER
        self.setObjectName("userMessage" if is_user else "assistantMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel)

        self._role = QLabel("You" if is_user else "Assistant")
        self._role.setObjectName("role")
        self._status = QLabel()
        self._status.setObjectName("messageStatus")
        self.copy_button = self._tool("Copy", "Copy the whole message as Markdown", self._copy)
        self.edit_button = self._tool("Edit", "Edit this message and resend the chat from here", self.edit_requested)
        self.regenerate_button = self._tool("Regenerate", "Generate this reply again", self.regenerate_requested)
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self._role)
        header.addWidget(self._status)
        header.addStretch(1)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(button)

        self._body = QVBoxLayout()
        self._body.setContentsMargins(0, 0, 0, 0)
        self._body.setSpacing(6)
        self._blocks: list[tuple[str, QWidget]] = []
        self.error_label = QLabel()
        self.error_label.setObjectName("inlineError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("stats")
        self.stats_label.setWordWrap(True)  # a narrow chat wraps the figures instead of cutting off the last

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addLayout(self._body)
        layout.addWidget(self.error_label)
        layout.addWidget(self.stats_label)
        # only now that the buttons have a parent: showing a parentless widget would open it as a window
        self.edit_button.setVisible(is_user)
        self.regenerate_button.setVisible(False)
        self.set_message(message)

    def _tool(self, text: str, tip: str, target) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
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

    def set_content(self, text: str) -> None:
        """Update the body in place; only blocks whose text changed are touched, so streaming never flickers."""
        self._text = text
        segments = [Segment("user", text)] if self.message.role == USER else split_markdown(text)
        for index, segment in enumerate(segments):
            if index < len(self._blocks) and self._blocks[index][0] == segment.kind:
                self._update_block(self._blocks[index][1], segment)
                continue
            self._truncate_blocks(index)
            self._add_block(segment)
        self._truncate_blocks(len(segments))

    def _add_block(self, segment: Segment) -> None:
        if segment.kind == "code":
            widget: QWidget = CodeBlockView(segment.text, segment.language)
        else:
            widget = _prose_label()
            if segment.kind == "user":
                widget.setTextFormat(Qt.TextFormat.PlainText)
            widget.setText(segment.text)
        self._blocks.append((segment.kind, widget))
        self._body.addWidget(widget)

    @staticmethod
    def _update_block(widget: QWidget, segment: Segment) -> None:
        if isinstance(widget, CodeBlockView):
            widget.set_text(segment.text, segment.language)
        elif isinstance(widget, QLabel) and widget.text() != segment.text:
            widget.setText(segment.text)

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
