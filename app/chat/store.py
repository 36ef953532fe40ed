"""ChatStore: chats, their messages, settings and open tabs in SQLite under the user data folder."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.paths import data_dir
from widgets.chat.data import ChatMessage, ChatSettings, ChatSummary

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}',
    backend TEXT NOT NULL DEFAULT 'local',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    tab_position INTEGER  -- NULL when the chat is not open in a tab
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    finish_reason TEXT,
    error TEXT,
    created REAL NOT NULL,
    UNIQUE (chat_id, position)
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, position);
"""


@dataclass
class StoredChat:
    chat_id: int
    title: str
    settings: ChatSettings
    backend: str = "local"
    messages: list[ChatMessage] = field(default_factory=list)


def default_path() -> Path:

    return data_dir() / "chats.sqlite3"


class ChatStore:
    """Every write commits at once, so a killed app loses nothing that was finished. Main thread only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        # a commit reaches the WAL file before it returns, so a killed studio loses nothing committed; only a power
        # loss may drop the last commits, never corrupt the file (SQLite's advice for WAL), and the UI thread does
        # not wait on an fsync every time a streaming reply is saved
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    # ---- chats ------------------------------------------------------------------------------
    def create_chat(self, title: str, settings: ChatSettings, backend: str = "local") -> int:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO chats (title, settings, backend, created, updated) VALUES (?, ?, ?, ?, ?)",
            (title, json.dumps(settings.to_dict()), backend, now, now),
        )
        return int(cursor.lastrowid)

    def update_chat(
        self,
        chat_id: int,
        *,
        title: str | None = None,
        settings: ChatSettings | None = None,
        backend: str | None = None,
    ) -> None:
        if title is not None:
            self._db.execute("UPDATE chats SET title = ?, updated = ? WHERE id = ?", (title, time.time(), chat_id))
        if settings is not None:
            self._db.execute("UPDATE chats SET settings = ? WHERE id = ?", (json.dumps(settings.to_dict()), chat_id))
        if backend is not None:
            self._db.execute("UPDATE chats SET backend = ? WHERE id = ?", (backend, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    def load_chat(self, chat_id: int) -> StoredChat | None:
        row = self._db.execute("SELECT title, settings, backend FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            return None
        rows = self._db.execute(
            "SELECT role, content, stats, finish_reason, error, created FROM messages "
            "WHERE chat_id = ? ORDER BY position",
            (chat_id,),
        ).fetchall()
        messages = [
            ChatMessage(role, content, json.loads(stats) if stats else None, finish, error, created)
            for role, content, stats, finish, error, created in rows
        ]
        return StoredChat(chat_id, row[0], ChatSettings.from_dict(json.loads(row[1])), row[2], messages)

    def list_chats(self, search: str = "") -> list[ChatSummary]:
        """Newest first; search matches the title or any message's text, case-insensitively."""
        pattern = f"%{search.strip()}%"
        rows = self._db.execute(
            """
            SELECT c.id, c.title, c.updated, c.tab_position,
                   (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id),
                   COALESCE((SELECT content FROM messages m WHERE m.chat_id = c.id AND ? != '%%'
                             AND m.content LIKE ? ORDER BY position LIMIT 1),
                            (SELECT content FROM messages m WHERE m.chat_id = c.id ORDER BY position LIMIT 1))
            FROM chats c
            WHERE ? = '%%' OR c.title LIKE ? OR EXISTS
                  (SELECT 1 FROM messages m WHERE m.chat_id = c.id AND m.content LIKE ?)
            ORDER BY c.updated DESC, c.id DESC
            """,
            (pattern, pattern, pattern, pattern, pattern),
        ).fetchall()
        # searching, the preview is the first message that matches (the dialog shows the words around the match)
        return [
            ChatSummary(chat_id, title, updated, count, (preview or "")[:4000], position is not None)
            for chat_id, title, updated, position, count, preview in rows
        ]

    # ---- messages ---------------------------------------------------------------------------
    def put_message(self, chat_id: int, position: int, message: ChatMessage) -> None:
        """Insert or replace the message at a position (0-based)."""
        self._db.execute(
            "INSERT OR REPLACE INTO messages (chat_id, position, role, content, stats, finish_reason, error, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                chat_id,
                position,
                message.role,
                message.content,
                json.dumps(message.stats) if message.stats else None,
                message.finish_reason,
                message.error,
                message.created,
            ),
        )
        self._db.execute("UPDATE chats SET updated = ? WHERE id = ?", (time.time(), chat_id))

    def truncate(self, chat_id: int, keep: int) -> None:
        """Drop every message from position `keep` on (edit-and-resend, regenerate)."""
        self._db.execute("DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, keep))

    def replace_messages(self, chat_id: int, messages: list[ChatMessage]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self.truncate(chat_id, 0)
            for position, message in enumerate(messages):
                self.put_message(chat_id, position, message)

    # ---- tabs -------------------------------------------------------------------------------
    def set_open_tabs(self, chat_ids: list[int]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("UPDATE chats SET tab_position = NULL")
            for position, chat_id in enumerate(chat_ids):
                self._db.execute("UPDATE chats SET tab_position = ? WHERE id = ?", (position, chat_id))

    def open_tabs(self) -> list[int]:
        rows = self._db.execute("SELECT id FROM chats WHERE tab_position IS NOT NULL ORDER BY tab_position").fetchall()
        return [row[0] for row in rows]
