"""The context meter and the overflow policy in the window, on the tiny model (context 2048 tokens)."""

from __future__ import annotations

import dataclasses

from app.chat.context_fit import fit_conversation, limits_for
from engine.domain.chat import ChatMessage, OverflowPolicy
from tests.app.conftest import settings, wait_idle


def long_history(turns: int = 12, words: int = 160) -> list[ChatMessage]:
    """About turns x 2 x words tokens: well past the tiny model's 2048-token context."""
    out = []
    for t in range(turns):
        out.append(ChatMessage("user", f"question {t}: " + "tell me more about it " * (words // 5)))
        out.append(ChatMessage("assistant", f"answer {t}: " + "here is a long answer " * (words // 5)))
    return out


def test_the_meter_counts_prompt_and_reply_against_the_context_and_the_pages_held(qtbot, make_window, ignore_eos):
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=400, system_prompt="You answer briefly."))
    assert chat.context.usage.context_tokens == 2048 and not chat.context.usage.approximate
    held: list[int] = []

    def pages_seen() -> bool:  # what the status timer does every 250 ms: read the engine's page map
        window.refresh_status()
        held.append(chat.context.usage.pages_held)
        return held[-1] > 0

    assert chat.send("hello there")
    qtbot.waitUntil(pages_seen, timeout=30_000)
    assert chat.busy  # the pages were counted while the reply was being written
    wait_idle(qtbot, chat)
    usage = chat.context.usage
    stats = chat.messages[-1].stats
    assert usage.system_tokens > 0 and usage.reply_tokens == stats.output_tokens == 400
    assert usage.used == stats.prompt_tokens + 400
    assert chat.panel.meter.text.startswith(f"Context {usage.used:,} / 2,048 tokens")
    chat.refresh_context()  # counted again, as a reopened chat or a newly loaded model is: the reply once, not twice
    again = chat.context.usage
    limits = limits_for(window.registry.get(chat.backend_id))
    sent_next = fit_conversation("You answer briefly.", chat.messages, limits, chat.settings.overflow, 400)
    assert again.reply_tokens == 400 and again.used == sent_next.prompt_tokens  # the reply inside that prompt
    qtbot.waitUntil(lambda: (window.refresh_status(), chat.context.usage.pages_cached > 0)[1], timeout=5000)
    assert chat.context.usage.pages_held == 0
    assert "KV pages cached" in chat.panel.meter.text


def test_stop_says_why_nothing_was_sent_and_offers_to_truncate(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.new_chat(settings(max_tokens=8, overflow=OverflowPolicy.STOP), "Long", long_history())
    assert chat.context.usage.used > 2048 and "(100%)" in chat.panel.meter.text
    assert chat.send("and one more thing")
    wait_idle(qtbot, chat)
    reply = chat.messages[-1]
    assert reply.finish_reason == "error" and "no longer fits the model's context of 2,048 tokens" in reply.error
    notice = chat.panel.notice
    assert notice.isVisible() and notice.action_button.text() == "Truncate the middle and retry"
    notice.action_button.click()
    assert chat.settings.overflow == OverflowPolicy.TRUNCATE_MIDDLE
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "length" and chat.messages[-1].stats.prompt_tokens < 2048


def test_truncating_the_middle_marks_the_dropped_turns_in_the_transcript(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    history = long_history()
    chat = window.tabs.new_chat(settings(max_tokens=8, overflow=OverflowPolicy.TRUNCATE_MIDDLE), "Long", history)
    assert chat.send("and one more thing")
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "length"
    views = chat.panel.transcript.views
    dropped = [i for i, v in enumerate(views) if v.property("dropped")]
    assert dropped[0] == 2 and dropped == list(range(2, 2 + len(dropped)))  # the first exchange stays
    assert len(dropped) % 2 == 0 and dropped[-1] < len(history)
    markers = chat.panel.transcript.dropped_markers
    assert len(markers) == 1 and f"the {len(dropped)} messages below" in markers[0]
    assert "truncated the middle" in markers[0]
    assert f"{len(dropped)} earlier messages left out" in chat.panel.meter.text


def test_a_rolling_window_drops_the_oldest_turns(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.new_chat(settings(max_tokens=8, overflow=OverflowPolicy.ROLLING), "Long", long_history())
    assert chat.send("and one more thing")
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason == "length"
    dropped = [i for i, v in enumerate(chat.panel.transcript.views) if v.property("dropped")]
    assert dropped[0] == 0 and dropped == list(range(len(dropped)))
    assert "rolling window" in chat.panel.transcript.dropped_markers[0]


def test_a_reply_that_runs_into_the_end_of_the_context_says_so(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    history = long_history(turns=2, words=140)  # about 1,700 tokens: a reply of up to 1,000 runs into the end
    chat = window.tabs.new_chat(dataclasses.replace(settings(max_tokens=1000)), "Nearly full", history)
    assert 1200 < chat.context.usage.used < 2000
    assert chat.send("go on")
    wait_idle(qtbot, chat, timeout=120_000)
    stats = chat.messages[-1].stats
    assert stats.prompt_tokens + stats.output_tokens >= 2047
    assert "stopped at the end of the model's context (2,048 tokens)" in chat.panel.notice.text


def test_a_send_encodes_the_conversation_once(qtbot, make_window, monkeypatch) -> None:
    """The fit's prompt ids go to the engine as they are: sixteen tabs sending at once each paid two encodes of their
    whole conversation in the UI thread, and the engine's requests arrived that much later."""
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=4))
    engine = window.registry.get(chat.backend_id).engine
    encoded: list[list[dict]] = []
    real_encode = engine.encode

    def counting_encode(*args, messages=None, **kwargs):
        if messages is not None and any(m["content"] == "count my tokens" for m in messages):
            encoded.append(messages)
        return real_encode(*args, messages=messages, **kwargs)

    monkeypatch.setattr(engine, "encode", counting_encode)
    assert chat.send("count my tokens")
    wait_idle(qtbot, chat)
    reply = chat.messages[-1]
    assert reply.finish_reason != "error" and reply.content, reply.error
    assert len(encoded) == 1
    assert reply.stats.prompt_tokens == len(real_encode(messages=encoded[0]))
