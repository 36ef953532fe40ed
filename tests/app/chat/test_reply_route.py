"""A chat tab's reply comes by one route, the request's sink: a failure in the engine thread before the request ran
reaches the tab the same way, so the tab ends its reply without waiting for Stop."""

from __future__ import annotations

from tests.app.conftest import settings, wait_idle


def test_a_request_the_engine_fails_to_add_ends_in_its_tab(qtbot, make_window, monkeypatch) -> None:
    window = make_window()
    engine = window.bridge.thread.engine
    original = engine.add_request

    def refuse_once(*args, **kwargs):
        monkeypatch.setattr(engine, "add_request", original)
        raise RuntimeError("injected while adding")

    monkeypatch.setattr(engine, "add_request", refuse_once)
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=4))
    chat.send("hello")
    wait_idle(qtbot, chat, timeout=30_000)  # nobody presses Stop
    failed = chat.messages[-1]
    assert failed.finish_reason == "error" and "injected while adding" in failed.error
    chat.send("hello again")  # the tab goes on
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "length" and chat.messages[-1].error is None
