"""ChatPanel: everything one chat tab shows: transcript, inline notices, the input with Send/Stop, its settings."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QSplitter, QVBoxLayout, QWidget

from widgets.chat.data import ChatSettings
from widgets.chat.message_input import ChatInput
from widgets.chat.sampling_panel import SamplingPanel
from widgets.chat.transcript_view import TranscriptView
from widgets.notice_bar import ERROR, INFO, NoticeBar


class ChatPanel(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal(int)
    settings_changed = Signal(object)  # ChatSettings

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatPanel")
        self.transcript = TranscriptView()
        self.notice = NoticeBar()
        self.edit_notice = NoticeBar()
        self.edit_notice.dismissed.connect(self._cancel_edit)
        self.input = ChatInput()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setDefault(False)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the reply and keep what was generated (Esc)")
        self.stop_button.setVisible(False)
        self.sampling = SamplingPanel()
        self.editing_index: int | None = None

        input_row = QHBoxLayout()
        input_row.setContentsMargins(12, 4, 12, 12)
        input_row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        input_row.addLayout(buttons)

        conversation = QWidget()
        column = QVBoxLayout(conversation)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.notice)
        column.addWidget(self.transcript, 1)
        column.addWidget(self.edit_notice)
        column.addLayout(input_row)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(conversation)
        self.splitter.addWidget(self.sampling)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        self.splitter.setCollapsible(0, False)
        self.splitter.setSizes([760, 250])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)

        self.input.send_requested.connect(self.send_requested)
        self.send_button.clicked.connect(self.input.send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.transcript.regenerate_requested.connect(self.regenerate_requested)
        self.transcript.edit_requested.connect(self.edit_requested)
        self.sampling.settings_changed.connect(self.settings_changed)

    def set_busy(self, busy: bool) -> None:
        """While a reply streams, Stop replaces Send (typing the next message stays possible)."""
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self.transcript.set_busy(busy)

    def set_settings(self, settings: ChatSettings) -> None:
        self.sampling.set_settings(settings)

    def set_settings_visible(self, visible: bool) -> None:
        self.sampling.setVisible(visible)

    def show_error(self, text: str) -> None:
        self.notice.show_message(text, ERROR)

    def show_info(self, text: str) -> None:
        self.notice.show_message(text, INFO)

    def begin_edit(self, index: int, text: str) -> None:
        self.editing_index = index
        self.input.setPlainText(text)
        self.input.setFocus()
        self.edit_notice.show_message("Editing an earlier message: sending resends the chat from there.", INFO)

    def _cancel_edit(self) -> None:
        if self.editing_index is not None:
            self.editing_index = None
            self.input.clear()

    def end_edit(self) -> None:
        self.editing_index = None
        self.edit_notice.setVisible(False)

    def clear_input(self) -> None:
        self.input.clear()
