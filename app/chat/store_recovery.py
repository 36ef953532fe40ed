"""Opening the chat store whatever state its file is in: checked at start; a damaged file is moved aside and what
SQLite can still read of it (after mending its 100-byte header, if that was hit) is salvaged into a fresh store; a
folder that cannot be written runs the studio with history off. Each case ends in one line for the notice bar."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.chat.store import ChatStore, default_path, failure_text

log = logging.getLogger(__name__)

HEADER_BYTES = 100
MAGIC = b"SQLite format 3\x00"
WINDOW = 256  # rows read at once while salvaging; a window that fails is read row by row
TABLES = {
    "chats": ("id", "title", "settings", "backend", "created", "updated", "tab_position"),
    "messages": ("id", "chat_id", "position", "role", "content", "stats", "finish_reason", "error", "created"),
}


@dataclass
class OpenedStore:
    store: ChatStore
    notice: str | None = None  # what the user must be told (the notice bar), or None when all is well
    warning: bool = False  # the notice says something went wrong (not just what was done about it)


def open_store(path: Path | None = None) -> OpenedStore:
    """The chat store at path (the user data folder's by default), checked; never raises for the file's state."""
    path = path or default_path()
    try:
        store = ChatStore(path)
    except sqlite3.DatabaseError as exc:
        if _cannot_write(exc) or not _writable(path.parent):
            return _history_off(path, exc)
        return _recover(path, str(exc))
    except OSError as exc:  # the folder cannot be created
        return _history_off(path, exc)
    try:
        problem = store.integrity_problem()
    except sqlite3.DatabaseError as exc:
        problem = str(exc)
    if problem is None:
        return OpenedStore(store)
    store.close()
    return _recover(path, problem)


def _cannot_write(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "unable to open" in text or "readonly" in text or "read-only" in text or "disk i/o" in text


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{time.time_ns()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def _history_off(path: Path, exc: BaseException) -> OpenedStore:
    log.warning("the chat store %s cannot be written (%s): history is off for this session", path, exc)
    store = ChatStore.in_memory(path)
    kept = " Earlier chats are shown, but changes are not kept." if store.list_chats() else ""
    notice = (f"History is off: chats are not saved this session, because {path.parent} cannot be written "
              f"({failure_text(exc)}).{kept}")  # fmt: skip
    return OpenedStore(store, notice, warning=True)


def _recover(path: Path, problem: str) -> OpenedStore:
    """Move the damaged file (and its WAL) aside, start a fresh store, salvage into it what can be read."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.stem}.damaged-{stamp}{path.suffix}")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.replace(Path(f"{aside}{suffix}"))
    log.warning("the chat store %s is damaged (%s); moved to %s", path, problem, aside)
    try:
        store = ChatStore(path)
    except (sqlite3.Error, OSError) as exc:
        opened = _history_off(path, exc)
        opened.notice = f"The chat store was damaged and moved to {aside}. {opened.notice}"
        return opened
    chats, messages = salvage(aside, store)
    recovered = (f"{chats} chats with {messages} messages were recovered into a fresh store" if chats
                 else "nothing could be read from it; a fresh store was started")  # fmt: skip
    notice = f"The chat store was damaged ({problem.splitlines()[0]}): it was moved to {aside}, and {recovered}."
    return OpenedStore(store, notice, warning=True)


def salvage(damaged: Path, into: ChatStore) -> tuple[int, int]:
    """Copy every chat and message SQLite can read from a damaged file into an empty store: (chats, messages).
    Reads a copy, so the damaged file stays as it was for the user to keep or send."""
    copy = damaged.with_name(damaged.name + ".salvage")
    try:
        shutil.copyfile(damaged, copy)
        wal = Path(f"{damaged}-wal")
        if wal.exists():
            shutil.copyfile(wal, Path(f"{copy}-wal"))
        if not _readable(copy):
            _mend_header(copy)
        db = sqlite3.connect(copy)
        try:
            return _copy_rows(db, into)
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        log.warning("salvaging %s stopped: %s", damaged, exc)
        return 0, 0
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)


def _readable(path: Path) -> bool:
    try:
        db = sqlite3.connect(path)
        try:
            db.execute("SELECT count(*) FROM sqlite_schema").fetchone()
        finally:
            db.close()
        return True
    except sqlite3.DatabaseError:
        return False


def _mend_header(path: Path) -> None:
    """Write a sound 100-byte header over a damaged one, for the page size that makes the file readable. The header
    holds no rows: the pages after it are the data, and the schema is on page 1 right after the header."""
    size = path.stat().st_size
    for page_size in (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512):
        if size % page_size:
            continue
        with path.open("r+b") as file:
            file.write(_header(page_size, size // page_size))
        if _readable(path):
            log.info("mended the header of %s (page size %d)", path, page_size)
            return


def _header(page_size: int, pages: int) -> bytes:
    """A database header as SQLite writes one (https://sqlite.org/fileformat.html, 1.3): WAL file format, UTF-8,
    schema format 4, no free-list (a salvage reads, it never allocates), the change counter matching."""
    header = bytearray(HEADER_BYTES)
    header[0:16] = MAGIC
    header[16:18] = (1 if page_size == 65536 else page_size).to_bytes(2, "big")
    header[18], header[19] = 2, 2  # WAL read and write versions
    header[21], header[22], header[23] = 64, 32, 32  # payload fractions (fixed by the format)
    header[24:28] = (1).to_bytes(4, "big")  # change counter
    header[28:32] = pages.to_bytes(4, "big")
    header[40:44] = (1).to_bytes(4, "big")  # schema cookie
    header[44:48] = (4).to_bytes(4, "big")  # schema format
    header[56:60] = (1).to_bytes(4, "big")  # UTF-8
    header[92:96] = (1).to_bytes(4, "big")  # version-valid-for = change counter
    major, minor, patch = sqlite3.sqlite_version_info
    header[96:100] = (major * 1_000_000 + minor * 1000 + patch).to_bytes(4, "big")
    return bytes(header)


def _rows(db: sqlite3.Connection, table: str) -> Iterator[tuple]:
    """The readable rows of a table by id: windows of ids, each window that fails read id by id."""
    columns = ", ".join(TABLES[table])
    try:
        top = db.execute(f"SELECT max(id) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        top = 1_000_000  # the b-tree's right edge is damaged: probe a generous range
    for low in range(1, top + 1, WINDOW):
        high = low + WINDOW - 1
        try:
            yield from db.execute(f"SELECT {columns} FROM {table} WHERE id BETWEEN ? AND ?", (low, high)).fetchall()
        except sqlite3.DatabaseError:
            for row_id in range(low, high + 1):
                try:
                    yield from db.execute(f"SELECT {columns} FROM {table} WHERE id = ?", (row_id,)).fetchall()
                except sqlite3.DatabaseError:
                    continue


def _copy_rows(db: sqlite3.Connection, into: ChatStore) -> tuple[int, int]:
    return into.import_rows(_rows(db, "chats"), _rows(db, "messages"))
