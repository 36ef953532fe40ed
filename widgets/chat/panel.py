"""ChatPanel: everything one chat tab shows: transcript, inline notices, the input with Send/Stop, the context meter,
and its settings sidebar, which folds away (into a popup) when the chat would get too narrow to read."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLayout,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.domain.chat import ChatSettings
from widgets.chat.context import ContextUsage
from widgets.chat.context_meter import ContextMeter
from widgets.chat.message_input import ChatInput
from widgets.chat.sampling_panel import SamplingPanel
from widgets.chat.transcript_view import TranscriptView
from widgets.notice_bar import ERROR, INFO, NoticeBar

#: the narrowest a conversation gets: about 60 characters of prose and the message box beside Send
CHAT_MIN_WIDTH = 480
DEFAULT_SIDEBAR_WIDTH = 260


class ChatPanel(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal(int)
    settings_changed = Signal(object)  # ChatSettings
    sidebar_toggled = Signal(bool)  # the user showed (True) or hid the settings sidebar
    sidebar_width_changed = Signal(int)  # the user dragged the splitter

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
        self.meter = ContextMeter()
        self.settings_button = QToolButton()
        self.settings_button.setObjectName("sidebarToggle")
        self.settings_button.setText("Chat settings")
        self.settings_button.setCheckable(True)
        self.settings_button.setAutoRaise(True)
        self.settings_button.setToolTip("Show or hide this chat's system prompt and sampling settings (Ctrl+Shift+P)")
        self.settings_button.clicked.connect(self._on_settings_button)
        self.editing_index: int | None = None
        self._sidebar_wanted = True
        self._sidebar_width = DEFAULT_SIDEBAR_WIDTH
        self._popup: QFrame | None = None

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self._build_conversation())
        self.splitter.addWidget(self.sampling)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        self.splitter.setCollapsible(0, False)
        self.splitter.setCollapsible(1, False)
        self.splitter.splitterMoved.connect(self._on_splitter_moved)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)
        # the panel's minimum is the conversation's alone: the sidebar folds away rather than widen the window
        layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)

        self.input.send_requested.connect(self.send_requested)
        self.send_button.clicked.connect(self.input.send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.transcript.regenerate_requested.connect(self.regenerate_requested)
        self.transcript.edit_requested.connect(self.edit_requested)
        self.sampling.settings_changed.connect(self.settings_changed)
        self._sync_button()

    def _build_conversation(self) -> QWidget:
        input_row = QHBoxLayout()
        input_row.setContentsMargins(12, 4, 12, 2)
        input_row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        input_row.addLayout(buttons)
        footer = QHBoxLayout()
        footer.setContentsMargins(12, 0, 8, 6)
        footer.addWidget(self.meter, 1)
        footer.addWidget(self.settings_button)

        conversation = QWidget()
        conversation.setObjectName("conversation")
        conversation.setMinimumWidth(CHAT_MIN_WIDTH)
        column = QVBoxLayout(conversation)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.notice)
        column.addWidget(self.transcript, 1)
        column.addWidget(self.edit_notice)
        column.addLayout(input_row)
        column.addLayout(footer)
        return conversation

    # ---- the settings sidebar ---------------------------------------------------------------
    def minimumSizeHint(self) -> QSize:
        return QSize(CHAT_MIN_WIDTH, super().minimumSizeHint().height())

    @property
    def sidebar_squeezed(self) -> bool:
        """The sidebar is wanted but there is no room for it beside a readable chat."""
        return self._sidebar_wanted and self.sampling.isHidden() and self._popup_sampling() is None

    def _room_for_sidebar(self) -> bool:
        needed = CHAT_MIN_WIDTH + self.splitter.handleWidth() + self.sampling.minimumSizeHint().width()
        return self.width() >= needed

    def set_settings_visible(self, visible: bool) -> None:
        """The user's choice (remembered by the window); shown only while the chat keeps its minimum width."""
        self._sidebar_wanted = visible
        self._fit_sidebar()

    def set_sidebar_width(self, width: int) -> None:
        self._sidebar_width = max(self.sampling.minimumSizeHint().width(), width)
        if not self.sampling.isHidden():
            self._apply_sidebar_width()

    def _apply_sidebar_width(self) -> None:
        total = sum(self.splitter.sizes())
        if total > 0:
            side = min(self._sidebar_width, max(0, total - CHAT_MIN_WIDTH))
            self.splitter.setSizes([total - side, side])

    def _on_splitter_moved(self, _pos: int, _index: int) -> None:
        self._sidebar_width = self.splitter.sizes()[1]
        self.sidebar_width_changed.emit(self._sidebar_width)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_sidebar()
        if not self.sampling.isHidden() and self.splitter.sizes()[1] != self._sidebar_width:
            # the remembered width, once the splitter has had its own resize and has a width to share out
            QTimer.singleShot(0, self, self._apply_sidebar_width)

    def _fit_sidebar(self) -> None:
        if self._popup_sampling() is not None:
            return  # shown in the popup for now; placed again when the popup closes
        show = self._sidebar_wanted and self._room_for_sidebar()
        if show != (not self.sampling.isHidden()):
            self.sampling.setVisible(show)
            if show:
                self._apply_sidebar_width()
        self._sync_button()

    def _sync_button(self) -> None:
        squeezed = self._sidebar_wanted and self.sampling.isHidden()
        self.settings_button.setChecked(not self.sampling.isHidden())
        self.settings_button.setText("Chat settings ▴" if squeezed else "Chat settings")
        if squeezed:
            self.settings_button.setToolTip("No room beside the chat: click to open the settings over it")

    def _on_settings_button(self) -> None:
        if self._sidebar_wanted and not self._room_for_sidebar():
            self.open_settings_popup()
        else:
            self.sidebar_toggled.emit(self.settings_button.isChecked())
        self._sync_button()

    def _popup_sampling(self) -> QWidget | None:
        return self.sampling if self._popup is not None and self.sampling.parent() is self._popup else None

    def open_settings_popup(self) -> QFrame:
        """The settings over the chat, for a window too narrow for the sidebar; they go back when it closes."""
        if self._popup is None:
            self._popup = QFrame(self, Qt.WindowType.Popup)
            self._popup.setObjectName("settingsPopup")
            self._popup.setFrameShape(QFrame.Shape.StyledPanel)
            QVBoxLayout(self._popup).setContentsMargins(0, 0, 0, 0)
            self._popup.installEventFilter(self)
        self._popup.layout().addWidget(self.sampling)
        self.sampling.show()
        hint = self.sampling.sizeHint()
        width = max(self.sampling.minimumSizeHint().width(), min(self._sidebar_width, self.width()))
        self._popup.resize(width, min(hint.height(), self.height()))
        corner = self.settings_button.mapToGlobal(self.settings_button.rect().topRight())
        self._popup.move(corner.x() - width, max(0, corner.y() - self._popup.height()))
        self._popup.show()
        return self._popup

    def _close_popup(self) -> None:
        self.splitter.addWidget(self.sampling)  # back into the splitter; _fit_sidebar decides if it shows
        self.splitter.setCollapsible(1, False)
        self.sampling.hide()
        self._fit_sidebar()

    # ---- typing anywhere in the chat goes to the message box -----------------------------------
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self._popup and event.type() == QEvent.Type.Hide:
            self._close_popup()
        return super().eventFilter(watched, event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Keys the transcript and its messages leave unused (they bubble up here) are typing meant for the box."""
        focus = QApplication.focusWidget()
        from_transcript = focus is not None and (focus is self.transcript or self.transcript.isAncestorOf(focus))
        if from_transcript and self._is_typing(event):
            self.input.setFocus(Qt.FocusReason.OtherFocusReason)
            self.input.moveCursor(self.input.textCursor().MoveOperation.End)
            QApplication.sendEvent(self.input, event)
            event.accept()
            return
        super().keyPressEvent(event)

    @staticmethod
    def _is_typing(event: QKeyEvent) -> bool:
        if event.matches(QKeySequence.StandardKey.Paste):
            return True
        modifiers = event.modifiers() & ~(Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.KeypadModifier)
        text = event.text()
        return modifiers == Qt.KeyboardModifier.NoModifier and bool(text) and text.isprintable()

    # ---- state ------------------------------------------------------------------------------
    def set_busy(self, busy: bool) -> None:
        """While a reply streams, Stop replaces Send (typing the next message stays possible)."""
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self.transcript.set_busy(busy)

    def set_settings(self, settings: ChatSettings) -> None:
        self.sampling.set_settings(settings)

    def set_context_usage(self, usage: ContextUsage) -> None:
        self.meter.set_usage(usage)

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
