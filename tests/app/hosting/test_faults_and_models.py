"""Problems stay in their tab; a failed model load keeps the old model; swapping models waits for or stops replies."""

from __future__ import annotations

import pytest

from app.hosting.model_switcher import FINISH, STOP
from engine.domain.model_choice import ModelChoice
from tests.app.conftest import settings, wait_idle


def test_a_prompt_too_long_is_shown_in_its_tab_while_another_tab_streams(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    streaming = window.tabs.current
    streaming.set_settings(settings(max_tokens=300))
    streaming.send("hello")
    broken = window.tabs.new_chat(settings())
    broken.send("hello world " * 1500)
    assert not broken.busy
    reply = broken.messages[-1]
    assert reply.finish_reason == "error" and "context" in reply.error
    view = broken.panel.transcript.views[-1]
    assert view.error_label.isVisibleTo(view) and "shorten it" in view.error_label.text()
    assert window.store.load_chat(broken.chat_id).messages[-1].error == reply.error
    assert streaming.streaming
    wait_idle(qtbot, streaming)
    assert streaming.messages[-1].finish_reason == "length" and streaming.messages[-1].stats.output_tokens == 300


def test_an_engine_error_mid_reply_is_inline_and_the_chat_goes_on(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=500))
    steps = {"count": 0}

    def explode(_scheduled) -> None:
        steps["count"] += 1
        if steps["count"] == 6:
            window.bridge.thread.engine.fault_injector = None
            raise RuntimeError("simulated device fault")

    window.bridge.thread.call(lambda engine: setattr(engine, "fault_injector", explode)).result(timeout=10)
    chat.send("hello")
    wait_idle(qtbot, chat)
    failed = chat.messages[-1]
    assert failed.finish_reason == "error" and "simulated device fault" in failed.error
    assert failed.content  # what was written before the fault stays
    view = chat.panel.transcript.views[-1]
    assert view.error_label.isVisibleTo(view) and view.text == failed.content
    chat.set_settings(settings(max_tokens=4))
    chat.send("hello again")
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "length" and chat.messages[-1].error is None


def test_a_model_that_fails_to_load_leaves_the_old_one_serving(qtbot, make_window, tmp_path) -> None:
    window = make_window()
    old_thread, old_info = window.bridge.thread, window.bridge.info
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ this is not json")
    failures: list[str] = []
    window.bridge.model_load_failed.connect(failures.append)
    assert window.load_model(ModelChoice(spec=str(broken)))
    qtbot.waitUntil(lambda: bool(failures), timeout=30_000)
    assert "not valid JSON" in failures[0]
    assert window.notice.isVisible() and f"Still using {old_info.name}" in window.notice.text
    assert window.bridge.thread is old_thread and window.bridge.info is old_info
    assert window.registry.get("local") is old_thread
    assert window.status.model.text() == old_info.name
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=3))
    chat.send("still there?")
    wait_idle(qtbot, chat)
    assert chat.messages[-1].error is None and chat.messages[-1].finish_reason in ("stop", "length")


@pytest.mark.parametrize("problem", ["truncated", "unreadable type", "too large"])
def test_a_model_refused_in_one_line_leaves_the_old_one_serving(
    qtbot, make_window, tmp_path, tiny_model_dir, monkeypatch, problem
) -> None:
    """A truncated GGUF file, one with a type nothing reads, and a model larger than the free memory: one line each,
    before any weight is read, and the loaded model goes on answering."""
    from gguf import GGMLQuantizationType as Q

    from engine.load import memory
    from tests.gguf_files import write_tiny_model

    window = make_window()
    old_thread, old_info = window.bridge.thread, window.bridge.info
    spec, expected = str(tiny_model_dir), "needs about"
    if problem == "truncated":
        spec = str(write_tiny_model(tmp_path / "cut.gguf", tiny_model_dir, lambda n: Q.Q4_0, truncate_to=50_000))
        expected = "cut.gguf is truncated"
    elif problem == "unreadable type":
        path = write_tiny_model(tmp_path / "odd.gguf", tiny_model_dir, lambda n: Q.Q8_1 if "ffn" in n else Q.Q4_0)
        spec, expected = str(path), "stores weights as Q8_1, which the studio cannot read"
    else:
        monkeypatch.setattr(memory, "free_memory_bytes", lambda device: 64 * 1024**2)
    failures: list[str] = []
    window.bridge.model_load_failed.connect(failures.append)
    assert window.load_model(ModelChoice(spec=spec))
    qtbot.waitUntil(lambda: bool(failures), timeout=60_000)
    assert expected in failures[0] and "\n" not in failures[0]
    assert window.notice.isVisible() and f"Still using {old_info.name}" in window.notice.text
    assert window.bridge.thread is old_thread and window.bridge.info is old_info
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=3))
    chat.send("still there?")
    wait_idle(qtbot, chat)
    assert chat.messages[-1].error is None and chat.messages[-1].finish_reason in ("stop", "length")


def test_a_new_model_waits_for_replies_to_finish_and_then_takes_new_messages(
    qtbot, make_window, tiny_choice, ignore_eos
) -> None:
    window = make_window()
    old_thread = window.bridge.thread
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=400))
    chat.send("hello")
    changed = []
    window.bridge.model_changed.connect(changed.append)
    assert window.load_model(tiny_choice, policy=FINISH)
    qtbot.waitUntil(lambda: window.bridge.swap_pending or bool(changed), timeout=30_000)
    if window.bridge.swap_pending:  # the usual case: the reply is still streaming on the old engine
        later = window.tabs.new_chat(settings(max_tokens=3))
        later.send("for the new model")
        assert later.busy and not later.streaming  # queued for the new model
        assert window.bridge.thread is old_thread
    wait_idle(qtbot, chat)
    qtbot.waitUntil(lambda: bool(changed), timeout=30_000)
    assert chat.messages[-1].finish_reason == "length" and chat.messages[-1].stats.output_tokens == 400
    assert window.bridge.thread is not old_thread
    qtbot.waitUntil(lambda: not old_thread.alive, timeout=30_000)
    for controller in window.tabs.controllers:
        wait_idle(qtbot, controller)
        assert controller.messages[-1].error is None


def test_switching_models_can_stop_the_replies_first(qtbot, make_window, tiny_choice, ignore_eos) -> None:
    window = make_window()
    old_thread = window.bridge.thread
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=1900))
    chat.send("hello")
    qtbot.waitUntil(lambda: bool(chat.messages[-1].content), timeout=30_000)
    assert window.load_model(tiny_choice, policy=STOP)
    qtbot.waitUntil(lambda: window.bridge.thread is not old_thread, timeout=30_000)
    assert chat.messages[-1].finish_reason == "abort" and chat.messages[-1].content
    assert window.store.load_chat(chat.chat_id).messages[-1].finish_reason == "abort"


def test_closing_a_streaming_tab_asks_first(qtbot, make_window, monkeypatch, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=1900))
    chat.send("hello")
    qtbot.waitUntil(lambda: bool(chat.messages[-1].content), timeout=30_000)
    questions = []
    monkeypatch.setattr(window, "confirm", lambda title, question: questions.append(question) or False)
    window.actions.close_chat.trigger()  # Ctrl+W
    assert questions and "still writing" in questions[0]
    assert window.tabs.current is chat and chat.streaming
    monkeypatch.setattr(window, "confirm", lambda title, question: True)
    window.actions.close_chat.trigger()
    assert chat not in window.tabs.controllers and len(window.tabs.controllers) == 1
    stored = window.store.load_chat(chat.chat_id)
    assert stored.messages[-1].finish_reason == "abort" and stored.messages[-1].content


def test_the_status_bar_shows_the_model_pages_and_requests(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    info = window.bridge.info
    assert window.status.model.text() == info.name
    # the precision names the load dtype, then the layers' measured format where the engine chose another one
    assert window.status.device.text() == "cpu" and window.status.precision.text().split(" · ")[0] == "float32"
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=1900))
    chat.send("hello")
    qtbot.waitUntil(lambda: len(chat.messages[-1].content) > 10, timeout=30_000)
    window.refresh_status()
    assert window.status.requests.text() == "running 1 · waiting 0"
    used = window.status.pages.value()
    assert used >= 1 and f"KV {used} / " in window.status.pages_label.text()
    chat.stop()
    wait_idle(qtbot, chat)
    window.refresh_status()
    assert window.status.requests.text() == "running 0 · waiting 0" and window.status.pages.value() == 0


class _Fatal(BaseException):
    """Escapes every `except Exception`: the engine thread dies of it."""


def test_an_engine_thread_that_dies_is_started_again_and_the_window_says_so(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=500))
    thread = window.bridge.thread
    steps = {"count": 0}

    def die(_scheduled) -> None:
        steps["count"] += 1
        if steps["count"] == 4:
            thread.engine.fault_injector = None
            raise _Fatal("simulated fatal fault")

    thread.call(lambda engine: setattr(engine, "fault_injector", die)).result(timeout=10)
    chat.send("hello")
    wait_idle(qtbot, chat)
    failed = chat.messages[-1]
    assert failed.finish_reason == "error" and "simulated fatal fault" in failed.error
    qtbot.waitUntil(lambda: window.notice.isVisible() and "started again" in window.notice.text, timeout=10_000)
    assert thread.alive and thread.restarts == 1 and window.bridge.thread is thread
    chat.set_settings(settings(max_tokens=4))
    chat.send("hello again")
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "length" and chat.messages[-1].error is None
