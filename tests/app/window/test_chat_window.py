"""The main window's chats: concurrent streaming, queueing while loading, stop, regenerate, edit-and-resend."""

from __future__ import annotations

from tests.app.conftest import settings, wait_idle


def test_two_tabs_stream_at_the_same_time_and_their_events_interleave(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    first = window.tabs.current
    second = window.tabs.new_chat(settings(max_tokens=120))
    first.set_settings(settings(max_tokens=120))
    frames: list[list[str]] = []
    window.pump.events_arrived.connect(lambda events: frames.append([e.tag for e in events]))

    assert first.send("hello world") and second.send("the quick brown fox")
    assert window.tabs.streaming_count() == 2
    qtbot.waitUntil(lambda: bool(first.messages[-1].content and second.messages[-1].content), timeout=30_000)
    window.actions.next_chat.trigger()  # switching tabs never stops a stream
    window.actions.next_chat.trigger()
    assert window.tabs.streaming_count() == 2
    wait_idle(qtbot, first, second)

    order = [tag for frame in frames for tag in frame]
    firsts = [order.index(c.title) for c in (first, second)]
    lasts = [len(order) - 1 - order[::-1].index(c.title) for c in (first, second)]
    assert max(firsts) < min(lasts), "one reply finished before the other started"
    assert len(frames) < len(order), "events must reach the UI batched per frame, not one signal per token"
    for controller in (first, second):
        reply = controller.messages[-1]
        assert reply.role == "assistant" and reply.finish_reason == "length" and reply.stats.output_tokens == 120
        shown = controller.panel.transcript.views[-1]
        assert shown.text == reply.content and "120 tokens" in shown.stats_label.text()


def test_a_message_sent_while_the_model_loads_waits_then_gets_its_reply(qtbot, make_window, tiny_choice) -> None:
    window = make_window(load=False)
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=4))
    assert chat.send("hello")
    assert chat.busy and not chat.streaming
    assert "waiting for the model" in chat.panel.transcript.views[-1]._status.text()
    window.load_model(tiny_choice)
    wait_idle(qtbot, chat)
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    assert chat.messages[-1].finish_reason in ("stop", "length") and chat.messages[-1].error is None


def test_stop_keeps_the_partial_reply_and_stores_it(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=1900))
    chat.send("hello")
    qtbot.waitUntil(lambda: len(chat.messages[-1].content) > 5, timeout=30_000)
    window.actions.stop.trigger()  # Esc
    wait_idle(qtbot, chat)
    reply = chat.messages[-1]
    assert reply.finish_reason == "abort" and reply.content
    assert reply.stats.output_tokens < 1900
    assert "stopped" in chat.panel.transcript.views[-1].stats_label.text()
    stored = window.store.load_chat(chat.chat_id)
    assert stored.messages[-1].content == reply.content and stored.messages[-1].finish_reason == "abort"


def test_regenerate_replaces_the_last_reply(qtbot, make_window) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=8))
    chat.send("hello world")
    wait_idle(qtbot, chat)
    before = chat.messages[-1].content
    window.actions.regenerate.trigger()
    assert chat.busy
    wait_idle(qtbot, chat)
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    assert chat.messages[-1].content == before  # greedy: the same reply again
    assert len(window.store.load_chat(chat.chat_id).messages) == 2


def test_edit_and_resend_drops_everything_after_the_edited_message(qtbot, make_window) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=4))
    for text in ("first question", "second question"):
        chat.send(text)
        wait_idle(qtbot, chat)
    assert len(chat.messages) == 4
    chat.panel.transcript.views[0].edit_button.click()
    assert chat.panel.input.toPlainText() == "first question" and chat.panel.editing_index == 0
    chat.panel.input.setPlainText("a better first question")
    chat.panel.send_button.click()
    wait_idle(qtbot, chat)
    assert [m.content for m in chat.messages[:1]] == ["a better first question"]
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    stored = window.store.load_chat(chat.chat_id).messages
    assert [m.content for m in stored] == [m.content for m in chat.messages]
    assert chat.panel.editing_index is None


def _marked(window, controller) -> bool:
    return window.tabs.widget.tabText(window.tabs.index_of(controller)).endswith(" ●")


def test_a_tab_title_is_marked_while_its_reply_is_under_way_and_not_after(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=200))
    assert chat.send("hello")
    qtbot.waitUntil(lambda: _marked(window, chat), timeout=10_000)
    assert chat.busy
    assert window.tabs.widget.tabToolTip(window.tabs.index_of(chat)) == "writing a reply…"
    wait_idle(qtbot, chat)
    qtbot.waitUntil(lambda: not _marked(window, chat), timeout=10_000)
    assert window.tabs.widget.tabText(window.tabs.index_of(chat)) == chat.title


def test_sends_in_one_pass_reach_the_engine_before_the_window_shows_them_busy(qtbot, make_window) -> None:
    """A compare or a burst of sends: each request goes to the engine before its tab's busy state is drawn, so the
    last one does not wait for the Send/Stop swaps and tab titles of every earlier tab."""
    from app.hosting.backends import LOCAL

    window = make_window()
    chats = [window.tabs.current, window.tabs.new_chat(), window.tabs.new_chat()]
    local = window.registry.get(LOCAL)
    seen: list[bool] = []  # at each submit: whether any tab's title was marked busy yet

    class Watched:
        def submit(self, **kwargs):
            seen.append(any(_marked(window, c) for c in chats))
            return local.submit(**kwargs)

        def __getattr__(self, name):
            return getattr(local, name)

    window.registry.set(LOCAL, Watched(), label="tiny")
    for chat in chats:
        chat.set_settings(settings(max_tokens=4))
    assert all(chat.send(f"question {i}") for i, chat in enumerate(chats))
    assert len(seen) == 3
    assert not any(seen)  # the titles are set once the pass is done, after every submit
    assert all(not chat.panel.stop_button.isHidden() for chat in chats)  # Stop, once its request went out
    wait_idle(qtbot, *chats)
    qtbot.waitUntil(lambda: not any(_marked(window, c) for c in chats), timeout=10_000)
    assert all(chat.messages[-1].error is None and chat.messages[-1].content for chat in chats)
