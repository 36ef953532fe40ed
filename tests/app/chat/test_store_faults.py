"""The chat store with its faults injected: random bytes in the file's header and in its middle (the studio used to
stop at every start with a DatabaseError), a folder that cannot be written (it stopped with "unable to open database
file"), and a full disk (create_chat raised with no message). The studio starts, salvages what SQLite can read, says
where the damaged file went, runs with history off where it cannot write, and a failed write loses nothing saved."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from app.chat.store import ChatStore
from app.chat.store_recovery import open_store
from engine.domain.chat import ASSISTANT, USER, ChatMessage, ChatSettings

CHATS, MESSAGES_EACH = 30, 100  # 3,000 messages, as the store held 3,004


def filled_store(path: Path) -> list[tuple[str, list[str]]]:
    """A store of CHATS chats with MESSAGES_EACH messages each, closed (checkpointed into the file)."""
    store = ChatStore(path)
    made = []
    for n in range(CHATS):
        chat_id = store.create_chat(f"chat {n}", ChatSettings(system_prompt=f"prompt {n}"))
        texts = [f"message {n}.{i} " + "x" * 200 for i in range(MESSAGES_EACH)]
        roles = [USER if i % 2 == 0 else ASSISTANT for i in range(len(texts))]
        store.replace_messages(chat_id, [ChatMessage(role, text) for role, text in zip(roles, texts, strict=True)])
        made.append((f"chat {n}", texts))
    store.close()
    return made


def overwrite(path: Path, offset: int, length: int, seed: int = 7) -> None:
    noise = random.Random(seed).randbytes(length)
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(noise)


def all_messages(store: ChatStore) -> dict[str, list[str]]:
    out = {}
    for summary in store.list_chats():
        chat = store.load_chat(summary.chat_id)
        out[chat.title] = [m.content for m in chat.messages]
    return out


def test_random_bytes_in_the_header_are_mended_and_every_message_recovered(tmp_path) -> None:
    path = tmp_path / "chats.sqlite3"
    made = filled_store(path)
    overwrite(path, 0, 100)
    with pytest.raises(sqlite3.DatabaseError):  # what stopped the studio at every start
        ChatStore(path)
    opened = open_store(path)
    aside = next(tmp_path.glob("chats.damaged-*.sqlite3"))
    assert str(aside) in opened.notice and opened.warning
    assert f"{CHATS} chats with {CHATS * MESSAGES_EACH} messages were recovered" in opened.notice
    assert all_messages(opened.store) == dict(made)
    assert opened.store.load_chat(1).settings.system_prompt == "prompt 0"
    assert opened.store.integrity_problem() is None
    assert aside.read_bytes()[:100] != path.read_bytes()[:100]  # the damaged file is kept as it was


def test_random_bytes_in_the_middle_keep_what_sqlite_can_read(tmp_path) -> None:
    path = tmp_path / "chats.sqlite3"
    made = dict(filled_store(path))
    size = path.stat().st_size
    overwrite(path, size // 2 // 4096 * 4096, 3 * 4096)  # three whole pages in the middle
    opened = open_store(path)
    assert opened.warning and "chats.damaged-" in opened.notice and "recovered" in opened.notice
    recovered = all_messages(opened.store)
    kept = sum(len(texts) for texts in recovered.values())
    assert 0 < kept <= CHATS * MESSAGES_EACH
    for title, texts in recovered.items():  # what came back is what was written, in order
        if title in made:
            assert all(text in made[title] for text in texts)
    # the fresh store works, and the next start finds it sound
    new_id = opened.store.create_chat("after", ChatSettings())
    assert new_id > 0
    opened.store.close()
    again = open_store(path)
    assert again.notice is None and again.store.load_chat(new_id).title == "after"


def test_a_folder_that_cannot_be_written_runs_with_history_off(tmp_path) -> None:
    """A folder under /sys: not even root can create files there (a chmod'ed folder does not stop root)."""
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(0o555)
        path = folder / "data" / "chats.sqlite3"
    elif Path("/sys/kernel").is_dir():
        path = Path("/sys/kernel/inference-studio-test/data/chats.sqlite3")
    else:
        pytest.skip("no folder here that root cannot write")
    opened = open_store(path)
    assert opened.warning and opened.notice.startswith("History is off") and str(path.parent) in opened.notice
    assert not opened.store.saving
    chat_id = opened.store.create_chat("in memory", ChatSettings())  # the session still works
    opened.store.put_message(chat_id, 0, ChatMessage(USER, "hello"))
    assert opened.store.load_chat(chat_id).messages[0].content == "hello"


def test_a_store_that_cannot_be_written_still_shows_its_chats(tmp_path, monkeypatch) -> None:
    """An existing store whose folder turned read-only (as root cannot be made here, the writable open is made to
    fail as SQLite does): history is off, the earlier chats are read from the file and shown."""
    import app.chat.store_recovery as recovery

    path = tmp_path / "chats.sqlite3"
    made = dict(filled_store(path)[:3])

    class ReadOnlyFolder(ChatStore):
        def __init__(self, path=None, *, connection=None) -> None:
            if connection is None:
                raise sqlite3.OperationalError("attempt to write a readonly database")
            super().__init__(path, connection=connection)

    monkeypatch.setattr(recovery, "ChatStore", ReadOnlyFolder)
    opened = recovery.open_store(path)
    assert opened.notice.startswith("History is off") and "Earlier chats are shown" in opened.notice
    recovered = all_messages(opened.store)
    assert all(recovered[title] == texts for title, texts in made.items())


def test_a_full_disk_says_so_and_loses_nothing_saved(tmp_path) -> None:
    """The file may not grow (SQLite's max_page_count: the same SQLITE_FULL a full disk gives): creating a chat
    and saving long messages fail with a message, the chat lives unsaved, and what was saved reads back whole."""
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    saved_id = store.create_chat("saved", ChatSettings())
    store.replace_messages(saved_id, [ChatMessage(USER, "kept"), ChatMessage(ASSISTANT, "also kept")])
    failures: list[str] = []
    store.on_write_failed = failures.append
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]  # the test fills the disk
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    new_id = None
    for n in range(200):  # the first inserts may still fit in the last page's free room
        new_id = store.create_chat(f"new {n} " + "y" * 2000, ChatSettings())
        if failures:
            break
    assert failures and "the disk is full" in failures[0]
    assert new_id < 0  # unsaved, in the window only
    store.put_message(new_id, 0, ChatMessage(USER, "not saved"))  # nothing to save it into: no second failure
    store.replace_messages(saved_id, [ChatMessage(USER, "z" * 100_000)])  # too big: refused whole
    assert len(failures) >= 2
    reopened = ChatStore(path)
    assert [m.content for m in reopened.load_chat(saved_id).messages] == ["kept", "also kept"]


def test_the_studio_opens_on_a_damaged_store_and_says_where_the_old_file_is(make_window, studio_home) -> None:
    path = studio_home / "data" / "chats.sqlite3"
    path.parent.mkdir(parents=True)
    filled_store(path)
    overwrite(path, 0, 100)
    window = make_window(load=False)  # used to raise DatabaseError here, at every start
    aside = next(path.parent.glob("chats.damaged-*.sqlite3"))
    assert str(aside) in window.notice.text and "recovered" in window.notice.text
    assert len(window.store.list_chats()) >= CHATS


def test_a_full_disk_in_the_window_opens_the_chat_unsaved_and_says_so(make_window) -> None:
    window = make_window(load=False)
    store = window.store
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]  # the test fills the disk
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    for _ in range(200):
        controller = window.tabs.new_chat(title="t" * 3000)  # Ctrl+T; used to raise with no message
        if controller.chat_id < 0:
            break
    assert controller.chat_id < 0 and window.tabs.current is controller
    assert "the disk is full" in window.notice.text
