"""Fitting a conversation into the context by the overflow policy (a counting function that is easy to follow)."""

from __future__ import annotations

from app.chat.context_fit import ContextLimits, approximate_count, fit_conversation, limits_for, overflow_message
from engine.domain.chat import ChatMessage, OverflowPolicy


def words(messages: list[dict]) -> int:
    """One token per word and one per message: the prompt's length is plain to read off the test."""
    return sum(len(m["content"].split()) + 1 for m in messages)


LIMITS = ContextLimits(length=40, count=words, approximate=False)


def chat(turns: int, words_each: int = 5) -> list[ChatMessage]:
    """turns exchanges and a newest question: u0 a0 u1 a1 ... u{turns}."""
    out = []
    for t in range(turns):
        out.append(ChatMessage("user", " ".join([f"u{t}"] * words_each)))
        out.append(ChatMessage("assistant", " ".join([f"a{t}"] * words_each)))
    out.append(ChatMessage("user", "newest question"))
    return out


def test_a_conversation_that_fits_goes_out_whole() -> None:
    fit = fit_conversation("be brief", chat(2), LIMITS, OverflowPolicy.STOP, max_tokens=100)
    assert fit.fits and fit.dropped == []
    assert [m["role"] for m in fit.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert fit.prompt_tokens == 3 + 4 * 6 + 3 and fit.system_tokens == 3


def test_stop_sends_nothing_once_the_prompt_no_longer_fits() -> None:
    fit = fit_conversation("", chat(7), LIMITS, OverflowPolicy.STOP, max_tokens=100)
    assert not fit.fits and fit.dropped == [] and fit.prompt_tokens == 14 * 6 + 3
    assert "no longer fits the model's context of 40 tokens" in overflow_message(fit, LIMITS, OverflowPolicy.STOP)


def test_truncate_the_middle_keeps_the_system_prompt_and_first_exchange() -> None:
    messages = chat(7)
    fit = fit_conversation("be brief", messages, LIMITS, OverflowPolicy.TRUNCATE_MIDDLE, max_tokens=5)
    assert fit.fits and fit.prompt_tokens + 5 <= 40
    kept = [m["content"].split()[0] for m in fit.messages]
    assert kept[:3] == ["be", "u0", "a0"] and kept[-1] == "newest"
    assert fit.dropped == list(range(2, 2 + len(fit.dropped)))  # whole turns, oldest after the first exchange
    assert len(fit.dropped) % 2 == 0 and fit.dropped[-1] < len(messages) - 1
    assert "truncated the middle" in fit.reason


def test_a_rolling_window_keeps_the_system_prompt_and_the_latest_turns() -> None:
    messages = chat(7)
    fit = fit_conversation("be brief", messages, LIMITS, OverflowPolicy.ROLLING, max_tokens=5)
    assert fit.fits
    assert fit.dropped == list(range(len(fit.dropped)))  # from the very start
    kept = [m["content"].split()[0] for m in fit.messages]
    assert kept[0] == "be" and kept[-1] == "newest" and "u0" not in kept
    assert "rolling window" in fit.reason


def test_as_few_turns_as_possible_are_dropped_and_room_is_left_for_a_reply() -> None:
    messages = chat(7)
    fit = fit_conversation("", messages, LIMITS, OverflowPolicy.ROLLING, max_tokens=10)  # room: min(10, 40 // 4) = 10
    assert fit.prompt_tokens + 10 <= 40
    one_more = [{"role": m.role, "content": m.content} for m in messages[len(fit.dropped) - 2 :]]
    assert words(one_more) + 10 > 40  # keeping one more turn would not have fit


def test_when_even_the_newest_message_does_not_fit_nothing_is_sent() -> None:
    messages = [*chat(2)[:-1], ChatMessage("user", "word " * 60)]
    fit = fit_conversation("", messages, LIMITS, OverflowPolicy.ROLLING, max_tokens=5)
    assert not fit.fits
    assert "leave no room for a reply" in overflow_message(fit, LIMITS, OverflowPolicy.ROLLING)


def test_an_unknown_context_sends_everything_and_counts_roughly() -> None:
    unknown = ContextLimits(length=None)
    fit = fit_conversation("", chat(20), unknown, OverflowPolicy.STOP, max_tokens=5)
    assert fit.fits and fit.dropped == [] and fit.prompt_tokens == approximate_count(fit.messages)


def test_failed_replies_without_text_are_not_counted_or_sent() -> None:
    messages = chat(1)
    messages.insert(2, ChatMessage("assistant", "", error="the engine failed"))
    fit = fit_conversation("", messages, LIMITS, OverflowPolicy.STOP, max_tokens=5)
    assert len(fit.messages) == 3


def test_a_remote_client_is_asked_for_its_context_once() -> None:
    class Client:
        context_length = None
        asked = 0

        def request_context_length(self) -> None:
            self.asked += 1

    client = Client()
    assert limits_for(client).length is None and client.asked == 1
    client.context_length = 4096
    limits = limits_for(client)
    assert limits.length == 4096 and limits.approximate
