"""ChatStore: chats, their messages, settings and open tabs in SQLite under the user data folder."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.domain.chat import ASSISTANT, USER, ChatMessage, ChatSettings, ChatSummary
from engine.domain.reply_stats import ReplyStats
from engine.paths import APP_NAME, HOME_ENV

log = logging.getLogger(__name__)

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
    """chats.sqlite3 in the user data folder (not created here: a read-only folder is the caller's to handle)."""
    import os

    import platformdirs

    home = os.environ.get(HOME_ENV)
    folder = Path(home).expanduser() / "data" if home else Path(platformdirs.user_data_dir(APP_NAME))
    return folder / "chats.sqlite3"


def failure_text(exc: BaseException) -> str:
    """What a failed read or write of the store means for the user, in a few words."""
    text = str(exc).strip() or type(exc).__name__
    lowered = text.lower()
    if "disk is full" in lowered or "no space" in lowered:
        return "the disk is full"
    if "readonly" in lowered or "read-only" in lowered or "permission" in lowered:
        return f"the chat store cannot be written ({text})"
    return text


def _writes(method):
    """A write that fails (a full disk, a folder made read-only, an I/O error) is said through on_write_failed and
    dropped: SQLite rolls it back whole, so what was saved before stays, and the window keeps what it shows."""

    @functools.wraps(method)
    def guarded(self: ChatStore, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            self._write_failed(exc)
            return None

    return guarded


class ChatStore:
    """Every write commits at once, so a killed app loses nothing that was finished. A write that fails is said
    (on_write_failed) and dropped; a chat that cannot even be created lives unsaved, with a negative id. Open one with
    store_recovery.open_store(), which checks the file and falls back when it is damaged or read-only. Main thread
    only."""

    def __init__(self, path: Path | None = None, *, connection: sqlite3.Connection | None = None) -> None:
        """connection: an open (in-memory) database to use instead of the file at path: the store then saves
        nothing to disk (saving is False)."""
        self.path = path or default_path()
        self.saving = connection is None
        #: called with a one-line reason when a write fails (the window shows it in its notice bar)
        self.on_write_failed: Callable[[str], None] | None = None
        self._unsaved_ids = itertools.count(-1, -1)
        if connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, isolation_level=None)
            connection.execute("PRAGMA journal_mode = WAL")
            # a commit reaches the WAL file before it returns, so a killed studio loses nothing committed; only a
            # power loss may drop the last commits, never corrupt the file (SQLite's advice for WAL), and the UI
            # thread does not wait on an fsync every time a streaming reply is saved
            connection.execute("PRAGMA synchronous = NORMAL")
        self._db = connection
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)

    @classmethod
    def in_memory(cls, path: Path | None = None) -> ChatStore:
        """A store that saves nothing to disk (history off), holding what a chats file at path has, if it can be
        read: the chats stay visible in a read-only folder."""
        memory = sqlite3.connect(":memory:", isolation_level=None)
        if path is not None and path.exists():
            try:
                source = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
                try:
                    source.backup(memory)
                finally:
                    source.close()
            except sqlite3.Error as exc:
                log.warning("the chats in %s could not be read (%s); starting without them", path, exc)
        return cls(path, connection=memory)

    def close(self) -> None:
        self._db.close()

    def integrity_problem(self) -> str | None:
        """None when SQLite finds the file sound (its quick check), else its first complaint."""
        rows = self._db.execute("PRAGMA quick_check").fetchall()
        first = rows[0][0] if rows else "no answer"
        return None if first == "ok" else str(first)

    def _write_failed(self, exc: BaseException) -> None:
        if self._db.in_transaction:  # a commit that failed leaves its transaction open: nothing of it is kept
            try:
                self._db.rollback()
            except sqlite3.Error:
                log.exception("rolling back a failed write failed too")
        reason = failure_text(exc)
        log.warning("could not save to the chat store %s: %s", self.path, exc)
        if self.on_write_failed is not None:
            self.on_write_failed(f"Could not save chats: {reason}. What was saved before is kept; the open chats "
                                 "stay in the window.")  # fmt: skip

    # ---- chats ------------------------------------------------------------------------------
    def create_chat(
        self, title: str, settings: ChatSettings, backend: str = "local", messages: Sequence[ChatMessage] = ()
    ) -> int:
        """The new chat's id, with its messages (an import) in the same transaction: all of it is saved or none.
        Negative when it could not be saved (a full disk): the chat then lives in the window only."""
        now = time.time()
        try:
            with self._db:
                self._db.execute("BEGIN")
                cursor = self._db.execute(
                    "INSERT INTO chats (title, settings, backend, created, updated) VALUES (?, ?, ?, ?, ?)",
                    (title, json.dumps(settings.to_dict()), backend, now, now),
                )
                chat_id = int(cursor.lastrowid)
                for position, message in enumerate(messages):
                    self._put(chat_id, position, message)
        except (sqlite3.Error, OSError) as exc:
            self._write_failed(exc)
            return next(self._unsaved_ids)
        return chat_id

    @_writes
    def update_chat(
        self,
        chat_id: int,
        *,
        title: str | None = None,
        settings: ChatSettings | None = None,
        backend: str | None = None,
    ) -> None:
        if chat_id < 0:
            return  # unsaved: nothing of it is in the file
        if title is not None:
            self._db.execute("UPDATE chats SET title = ?, updated = ? WHERE id = ?", (title, time.time(), chat_id))
        if settings is not None:
            self._db.execute("UPDATE chats SET settings = ? WHERE id = ?", (json.dumps(settings.to_dict()), chat_id))
        if backend is not None:
            self._db.execute("UPDATE chats SET backend = ? WHERE id = ?", (backend, chat_id))

    @_writes
    def delete_chat(self, chat_id: int) -> None:
        self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    def load_chat(self, chat_id: int) -> StoredChat | None:
        """The chat, or None when it is not stored. Values a damaged or hand-edited file holds that do not parse are
        read as their defaults (a chat that cannot be opened would be lost to the user)."""
        row = self._db.execute("SELECT title, settings, backend FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            return None
        rows = self._db.execute(
            "SELECT role, content, stats, finish_reason, error, created FROM messages "
            "WHERE chat_id = ? ORDER BY position",
            (chat_id,),
        ).fetchall()
        messages = [_message(*row) for row in rows]
        title, settings, backend = row
        return StoredChat(chat_id, str(title), _settings(settings), str(backend), messages)

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
    @_writes
    def put_message(self, chat_id: int, position: int, message: ChatMessage) -> None:
        """Insert or replace the message at a position (0-based)."""
        if chat_id >= 0:
            self._put(chat_id, position, message)

    def _put(self, chat_id: int, position: int, message: ChatMessage) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO messages (chat_id, position, role, content, stats, finish_reason, error, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                chat_id,
                position,
                message.role,
                message.content,
                _stats_json(message),
                message.finish_reason,
                message.error,
                message.created,
            ),
        )
        self._db.execute("UPDATE chats SET updated = ? WHERE id = ?", (time.time(), chat_id))

    @_writes
    def truncate(self, chat_id: int, keep: int) -> None:
        """Drop every message from position `keep` on (edit-and-resend, regenerate)."""
        self._db.execute("DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, keep))

    @_writes
    def replace_messages(self, chat_id: int, messages: list[ChatMessage]) -> None:
        """All of a chat's messages at once, in one transaction: all are saved, or none (and the old ones stay)."""
        if chat_id < 0:
            return
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM messages WHERE chat_id = ?", (chat_id,))
            for position, message in enumerate(messages):
                self._put(chat_id, position, message)

    def import_rows(self, chats: Iterable[tuple], messages: Iterable[tuple]) -> tuple[int, int]:
        """Rows read from another chats file (a damaged one being salvaged), in one transaction, with the values that
        do not parse read as their defaults and messages whose chat is missing kept under a chat of their own:
        (chats, messages) imported. chats: (id, title, settings, backend, created, updated, tab_position);
        messages: (id, chat_id, position, role, content, stats, finish_reason, error, created)."""
        chat_ids: set[int] = set()
        count = 0
        with self._db:
            self._db.execute("BEGIN")
            for chat_id, title, settings, backend, created, updated, tab in chats:
                if isinstance(chat_id, int) and chat_id > 0:
                    self._insert_chat(chat_id, title, settings, backend, created, updated, tab)
                    chat_ids.add(chat_id)
            for _, chat_id, position, role, content, stats, finish, error, created in messages:
                if not (isinstance(chat_id, int) and chat_id > 0 and isinstance(position, int)):
                    continue
                if role not in (USER, ASSISTANT) or not isinstance(content, str):
                    continue
                if chat_id not in chat_ids:  # its chat's row was lost: the messages keep a chat of their own
                    self._insert_chat(chat_id, None, None, None, None, None, None)
                    chat_ids.add(chat_id)
                message = _message(role, content, stats, finish, error, created)
                self._db.execute(
                    "INSERT OR IGNORE INTO messages (chat_id, position, role, content, stats, finish_reason, error, "
                    "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (chat_id, position, message.role, message.content, _stats_json(message), message.finish_reason,
                     message.error, message.created),
                )  # fmt: skip
                count += 1
        return len(chat_ids), count

    def _insert_chat(self, chat_id: int, title, settings, backend, created, updated, tab) -> None:
        now = time.time()
        self._db.execute(
            "INSERT OR IGNORE INTO chats (id, title, settings, backend, created, updated, tab_position) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (chat_id, title if isinstance(title, str) and title else f"Recovered chat {chat_id}",
             json.dumps(_settings(settings).to_dict()), backend if isinstance(backend, str) else "local",
             created if isinstance(created, (int, float)) else now, updated if isinstance(updated, (int, float))
             else now, tab if isinstance(tab, int) else None),
        )  # fmt: skip

    # ---- tabs -------------------------------------------------------------------------------
    @_writes
    def set_open_tabs(self, chat_ids: list[int]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("UPDATE chats SET tab_position = NULL")
            for position, chat_id in enumerate(i for i in chat_ids if i >= 0):
                self._db.execute("UPDATE chats SET tab_position = ? WHERE id = ?", (position, chat_id))

    def open_tabs(self) -> list[int]:
        rows = self._db.execute("SELECT id FROM chats WHERE tab_position IS NOT NULL ORDER BY tab_position").fetchall()
        return [row[0] for row in rows]


def _stats_json(message: ChatMessage) -> str | None:
    return json.dumps(message.stats.to_dict()) if message.stats is not None else None


def _message(role, content, stats, finish, error, created) -> ChatMessage:
    """A stored message row, with what does not parse read as nothing."""
    when = created if isinstance(created, (int, float)) else time.time()
    error = error if isinstance(error, str) else None
    return ChatMessage(str(role), str(content), ReplyStats.from_dict(_json_dict(stats)), finish, error, when)


def _json_dict(text: object) -> dict | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _settings(text: object) -> ChatSettings:
    try:
        return ChatSettings.from_dict(_json_dict(text))
    except (TypeError, ValueError):
        return ChatSettings()
