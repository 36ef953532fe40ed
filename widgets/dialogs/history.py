"""HistoryDialog: every stored chat, newest first, with search; reopen one in a tab or delete it."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.domain.chat import ChatSummary

Search = Callable[[str], list[ChatSummary]]


SNIPPET_CHARS = 90


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def snippet(text: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """The words around the first match of `query` in `text` on one line ("…around the match…"), or ""."""
    query = query.strip()
    at = text.lower().find(query.lower()) if query else -1
    if at < 0:
        return ""
    flat = " ".join(text.split())
    at = flat.lower().find(query.lower())
    if at < 0:
        return ""
    start = max(0, at - (width - len(query)) // 2)
    end = min(len(flat), start + width)
    start = max(0, end - width)
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


class HistoryDialog(QDialog):
    open_requested = Signal(int)
    delete_requested = Signal(int)

    def __init__(self, search: Search, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Chat history")
        self.setObjectName("historyDialog")
        self._search = search
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search titles and messages")
        self.query.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.setAlternatingRowColors(True)
        self.list.itemActivated.connect(lambda _item: self._open())
        self.list.currentRowChanged.connect(lambda _row: self._update_buttons())
        self.empty = QLabel("No chats match.")
        self.empty.setObjectName("hint")
        self.open_button = QPushButton("Open")
        self.open_button.setDefault(True)
        self.open_button.clicked.connect(self._open)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        buttons.addWidget(self.open_button)
        buttons.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.query)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.empty)
        layout.addLayout(buttons)
        self._debounce = QTimer(self, singleShot=True, interval=200)
        self._debounce.timeout.connect(self.refresh)
        self.query.textChanged.connect(self._debounce.start)
        self.resize(560, 480)
        self.refresh()

    def refresh(self) -> None:
        selected = self.selected_chat_id()
        self.list.clear()
        query = self.query.text()
        for chat in self._search(query):
            state = " · open" if chat.is_open else ""
            found = snippet(chat.preview, query)  # where the words were found, when it was not the title
            found = f"\n{found}" if found and query.strip().lower() not in chat.title.lower() else ""
            item = QListWidgetItem(f"{chat.title}\n{chat.message_count} messages · {_when(chat.updated)}{state}{found}")
            item.setData(Qt.ItemDataRole.UserRole, chat.chat_id)
            item.setToolTip(chat.preview[:300])
            self.list.addItem(item)
            if chat.chat_id == selected:
                self.list.setCurrentItem(item)
        if self.list.currentRow() < 0 and self.list.count():
            self.list.setCurrentRow(0)
        self.empty.setVisible(self.list.count() == 0)
        self._update_buttons()

    def selected_chat_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def _update_buttons(self) -> None:
        has = self.selected_chat_id() is not None
        self.open_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def _open(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is not None:
            self.open_requested.emit(chat_id)

    def _delete(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is not None:
            self.delete_requested.emit(chat_id)
            self.refresh()
