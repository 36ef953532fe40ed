"""A reply that runs into the end of a small KV cache: the status bar shows its pages given back at once, and the
reply's stats line says where it stopped (defect 8 of the window issue)."""

from __future__ import annotations

import dataclasses

from engine.domain.chat import ChatMessage, format_stats
from engine.domain.reply_stats import ReplyStats
from tests.app.conftest import settings, wait_idle


def test_pages_go_back_and_the_stats_line_names_the_context_end(qtbot, make_window, tiny_choice, ignore_eos) -> None:
    window = make_window(load=False)
    window.load_model(dataclasses.replace(tiny_choice, kv_memory_mib=0.25))  # the pool holds fewer tokens than 2,048
    qtbot.waitUntil(lambda: window.bridge.thread is not None, timeout=60_000)
    chat = window.tabs.current
    context = chat.context.usage.context_tokens
    assert 0 < context < 2048  # the KV cache, not the model, limits the context
    chat.set_settings(settings(max_tokens=context))  # more than fits after the prompt: the pool runs out first
    assert chat.send("tell me everything")
    wait_idle(qtbot, chat, timeout=120_000)
    reply = chat.messages[-1]
    assert reply.finish_reason == "length" and reply.stats.context_full
    assert "stopped at the end of the context" in format_stats(reply) and "token limit" not in format_stats(reply)
    window.refresh_status()
    label = window.status.pages_label.text()
    assert label.startswith("KV 0 /"), label  # was the full pool, until the next request
    assert window.status.pages.value() == 0


def test_a_reply_cut_by_its_own_limit_still_says_token_limit() -> None:
    reply = ChatMessage("assistant", "x", stats=ReplyStats(output_tokens=8), finish_reason="length")
    assert "hit the token limit" in format_stats(reply)
