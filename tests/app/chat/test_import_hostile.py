"""Hostile chat files for File > Import: each is refused with one line naming what is wrong, nothing is stored, and
the window stays responsive while a big file is read. They used to raise RecursionError, TypeError, AttributeError
or UnicodeEncodeError with no message, or store a chat that threw every time it was opened from History."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from app.chat.chat_file import MAX_FILE_BYTES
from app.chat.export import ChatImportError, from_json, read_chat
from engine.domain.reply_stats import ReplyStats

GOOD = {
    "format": "inference-studio-chat",
    "version": 1,
    "title": "A chat",
    "settings": {"temperature": 0.5, "system_prompt": "Be brief."},
    "messages": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi", "stats": {"output_tokens": 1, "ttft_s": 0.1}, "finish_reason": "stop"},
    ],
}


def with_change(path: str, value) -> str:
    """GOOD with one field replaced (path like "settings.temperature" or "messages.1.stats")."""
    data = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    target = data
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return json.dumps(data)


DEEP = '{"format": "inference-studio-chat", "version": 1, "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
DIGITS = '{"format": "inference-studio-chat", "version": 1, "messages": [], "x": 1' + "0" * 5000 + "}"
HOSTILE = {
    "nested 100,000 deep": (DEEP, "nested"),
    "nested 20 deep": (with_change("messages.0.stats", json.loads("[" * 20 + "]" * 20)), "nested"),
    "version as text": (with_change("version", "2"), '"version" must be 1'),
    "version null": (with_change("version", None), '"version" must be 1'),
    "stats a string": (with_change("messages.1.stats", "fast"), '"stats" must be null or an object of numbers'),
    "stats of strings": (with_change("messages.1.stats", {"ttft_s": "soon"}), '"stats"'),
    "temperature as text": (with_change("settings.temperature", "hot"), 'setting "temperature" must be a number'),
    "max_tokens a float": (with_change("settings.max_tokens", 1.5), 'setting "max_tokens"'),
    "seed too big": (with_change("settings.seed", 2**70), 'setting "seed"'),
    "settings a list": (with_change("settings", [1, 2]), '"settings" must be an object'),
    "error an int": (with_change("messages.1.error", 5), '"error" must be null or text'),
    "role unknown": (with_change("messages.0.role", "system"), '"role"'),
    "content missing": (with_change("messages.0", {"role": "user"}), '"content" must be text'),
    "title a number": (with_change("title", 7), '"title" must be text'),
    "lone surrogate": (with_change("messages.0.content", "\ud800"), "lone surrogate"),
    "digits": (DIGITS, "too many digits"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_files_are_refused_with_a_reason(tmp_path: Path, name: str) -> None:
    text, reason = HOSTILE[name]
    path = tmp_path / "hostile.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(ChatImportError, match=reason.replace("(", r"\(")) as refused:
        read_chat(path)
    assert "\n" not in str(refused.value)


def test_a_good_file_still_imports() -> None:
    document = from_json(json.dumps(GOOD))
    assert document.title == "A chat" and document.settings.temperature == 0.5
    assert [m.content for m in document.messages] == ["hello", "hi"]


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as file:
        file.truncate(100 * 1024 * 1024)  # 100 MB (sparse: nothing is written, and nothing should be read)
    started = time.monotonic()
    with pytest.raises(ChatImportError, match=f"at most {MAX_FILE_BYTES // 2**20} MiB"):
        read_chat(path)
    assert time.monotonic() - started < 60  # generous: a read would take far longer on this machine


@pytest.mark.parametrize("name", ["stats a string", "temperature as text", "lone surrogate", "nested 20 deep"])
def test_the_window_refuses_them_without_storing_anything(qtbot, make_window, tmp_path, name: str) -> None:
    window = make_window(load=False)
    chats_before = len(window.store.list_chats())
    tabs_before = len(window.tabs.controllers)
    path = tmp_path / "hostile.json"
    path.write_text(HOSTILE[name][0], encoding="utf-8", errors="surrogatepass")
    with qtbot.waitSignal(window.chat_imported, timeout=30_000) as imported:
        window.import_chat(path)
    assert imported.args == [False]
    assert window.notice.text.startswith("Could not import:") and "\n" not in window.notice.text
    assert len(window.store.list_chats()) == chats_before and len(window.tabs.controllers) == tabs_before


def test_a_big_file_is_read_off_the_ui_thread(qtbot, make_window, tmp_path, monkeypatch) -> None:
    """The read is made to take a while: the window's event loop keeps turning meanwhile."""
    import app.chat.importer as importer

    path = tmp_path / "chat.json"
    path.write_text(json.dumps(GOOD))
    real = importer.read_chat
    monkeypatch.setattr(importer, "read_chat", lambda p: (time.sleep(1.0), real(p))[1])
    window = make_window(load=False)
    ticks = []
    from PySide6.QtCore import QTimer

    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)
    with qtbot.waitSignal(window.chat_imported, timeout=30_000) as imported:
        window.import_chat(path)
    timer.stop()
    assert imported.args == [True] and len(ticks) >= 5  # the loop ran during the read
    assert window.tabs.current.messages[1].stats == ReplyStats(output_tokens=1, ttft_s=0.1)
