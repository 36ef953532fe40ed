"""Chats survive a restart of the window; export as Markdown/JSON and import; the history list."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from engine.domain.chat import INTERRUPTED, format_stats
from tests.app.conftest import settings, wait_idle


def test_tabs_messages_and_settings_reopen_after_a_restart(qtbot, make_window) -> None:
    window = make_window()
    first = window.tabs.current
    first.set_settings(settings(max_tokens=5, system_prompt="You are terse."))
    first.send("hello world")
    second = window.tabs.new_chat(settings(max_tokens=3, seed=7))
    second.send("the quick brown fox")
    wait_idle(qtbot, first, second)
    second.rename("Foxes")
    window.tabs.widget.tabBar().moveTab(1, 0)  # drag "Foxes" to the front
    window.tabs.widget.setCurrentIndex(0)
    before = [(c.title, c.settings, [(m.role, m.content, m.finish_reason) for m in c.messages])
              for c in window.tabs.controllers]  # fmt: skip
    window.close()

    reopened = make_window(load=False)
    after = [(c.title, c.settings, [(m.role, m.content, m.finish_reason) for m in c.messages])
             for c in reopened.tabs.controllers]  # fmt: skip
    assert after == before
    assert [c.title for c in reopened.tabs.controllers] == ["Foxes", "Chat 1"]
    assert reopened.tabs.current.title == "Foxes"  # the tab in front stays in front
    assert reopened.tabs.controllers[0].messages[-1].stats.output_tokens == 3
    views = reopened.tabs.controllers[1].panel.transcript.views
    assert views[-1].text == before[1][2][-1][1]
    assert reopened.tabs.controllers[1].panel.sampling.system_prompt.toPlainText() == "You are terse."


def test_quitting_mid_reply_keeps_its_text_and_statistics_like_esc(qtbot, make_window, ignore_eos) -> None:
    """Closing the window (Ctrl+Q) mid-reply stops it as Esc does: the text and the statistics line are stored."""
    window = make_window()
    stopped, quit_ = window.tabs.current, window.tabs.new_chat(settings(max_tokens=1900))
    stopped.set_settings(settings(max_tokens=1900))
    stopped.send("hello")
    quit_.send("hello")
    qtbot.waitUntil(lambda: len(stopped.messages[-1].content) > 3 and len(quit_.messages[-1].content) > 3,
                    timeout=30_000)  # fmt: skip
    stopped.stop()  # Esc
    wait_idle(qtbot, stopped)
    thread = window.bridge.thread
    window.close()
    assert not thread.alive
    esc, quitted = (window.store.load_chat(c.chat_id).messages for c in (stopped, quit_))
    assert quitted[0].content == "hello"
    assert quitted[1].finish_reason == "abort" and quitted[1].content == quit_.messages[-1].content
    assert quitted[1].error is None  # ended, not interrupted
    assert esc[1].stats is not None and quitted[1].stats is not None
    assert quitted[1].stats.to_dict().keys() == esc[1].stats.to_dict().keys() and quitted[1].stats.output_tokens > 0
    assert format_stats(quitted[1]).endswith("stopped") and "tokens" in format_stats(quitted[1])


def test_a_studio_killed_mid_reply_keeps_the_partial_reply_marked_interrupted(
    qtbot, make_window, studio_home, tiny_model_dir, tmp_path
) -> None:
    """kill -9 of a real studio process while a reply streams; the store, reopened, holds the reply so far."""
    env = {**os.environ, "INFERENCE_STUDIO_HOME": str(studio_home), "QT_QPA_PLATFORM": "offscreen",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    log = (tmp_path / "driver.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.app.chat.studio_driver", str(tiny_model_dir), "1900"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        database = studio_home / "data" / "chats.sqlite3"
        saves: list[str] = []
        deadline = time.monotonic() + 120
        while len(set(saves)) < 2:  # two saves of the growing reply: saved while it streams, not only at its end
            assert process.poll() is None, (tmp_path / "driver.log").read_text()
            assert time.monotonic() < deadline, "no partial reply was saved"
            saves += [row[0] for row in _assistant_rows(database) if row[0]]
            time.sleep(0.2)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
    content, finish_reason, error = _assistant_rows(database)[-1]
    assert content.startswith(saves[-1]) and finish_reason is None and error == INTERRUPTED
    window = make_window(load=False)  # the same data folder: the studio restarted
    reply = window.tabs.current.messages[-1]
    assert reply.content == content and reply.error == INTERRUPTED
    view = window.tabs.current.panel.transcript.views[-1]
    assert view.error_label.isVisibleTo(view) and "Interrupted" in view.error_label.text()


def _assistant_rows(database) -> list[tuple]:
    if not database.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as db:
        try:
            return db.execute(
                "SELECT content, finish_reason, error FROM messages WHERE role = 'assistant' ORDER BY id"
            ).fetchall()
        except sqlite3.OperationalError:  # the studio has not made its tables yet
            return []


def test_export_markdown_and_json_then_import_the_json(qtbot, make_window, tmp_path) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=4, system_prompt="Be kind."))
    chat.send("hello world")
    wait_idle(qtbot, chat)
    chat.rename("Greeting")

    window.export_chat(tmp_path / "chat.md", "md")
    markdown = (tmp_path / "chat.md").read_text()
    assert markdown.startswith("# Greeting\n") and "## You\n\nhello world" in markdown
    assert "Be kind." in markdown and "## Assistant" in markdown and "4 tokens" in markdown

    window.export_chat(tmp_path / "chat.json", "json")
    data = json.loads((tmp_path / "chat.json").read_text())
    assert data["format"] == "inference-studio-chat" and data["title"] == "Greeting"
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]

    with qtbot.waitSignal(window.chat_imported, timeout=30_000) as imported_signal:
        window.import_chat(tmp_path / "chat.json")
    assert imported_signal.args == [True]
    imported = window.tabs.current
    assert imported is not chat and imported.title == "Greeting (imported)"  # the original is still open
    assert [(m.role, m.content) for m in imported.messages] == [(m.role, m.content) for m in chat.messages]
    assert imported.settings == chat.settings
    assert window.store.load_chat(imported.chat_id).messages[1].content == chat.messages[1].content


def test_importing_a_broken_file_says_why_without_a_dialog(qtbot, make_window, tmp_path) -> None:
    window = make_window(load=False)
    tabs_before = len(window.tabs.controllers)
    (tmp_path / "bad.json").write_text("{not json")
    with qtbot.waitSignal(window.chat_imported, timeout=30_000) as imported:
        window.import_chat(tmp_path / "bad.json")
    assert imported.args == [False]
    assert "not valid JSON" in window.notice.text and window.notice.isVisible()
    (tmp_path / "other.json").write_text(json.dumps({"messages": []}))
    with qtbot.waitSignal(window.chat_imported, timeout=30_000) as imported:
        window.import_chat(tmp_path / "other.json")
    assert imported.args == [False]
    assert "not a chat exported by Inference Studio" in window.notice.text
    assert len(window.tabs.controllers) == tabs_before


def test_history_searches_reopens_and_deletes(qtbot, make_window) -> None:
    window = make_window(load=False)
    window.tabs.new_chat(title="Recipes")
    window.tabs.current.rename("Soup recipes")
    other = window.tabs.new_chat(title="Travel")
    window.tabs.close_tab(window.tabs.index_of(other))
    window.open_history()
    history = window.history_dialog
    titles = [history.list.item(i).text().splitlines()[0] for i in range(history.list.count())]
    assert set(titles) == {"Chat 1", "Soup recipes", "Travel"}

    history.query.setText("trav")
    qtbot.waitUntil(lambda: history.list.count() == 1, timeout=5_000)  # after the typing pause
    history.open_button.click()
    assert window.tabs.current.title == "Travel"

    history.query.setText("soup")
    history.refresh()
    soup_id = history.selected_chat_id()
    history.delete_button.click()
    assert window.store.load_chat(soup_id) is None
    assert "Soup recipes" not in [c.title for c in window.tabs.controllers]
    assert history.list.count() == 0 and history.empty.isVisibleTo(history)
