"""ChatContext: a streaming reply's count reaches the meter a few times a second, and nothing is left behind."""

from __future__ import annotations

import pytest

from app.chat import context_tracker
from app.chat.context_tracker import STREAMING_SHOW_S, ChatContext
from engine.core.metrics import PageMap
from engine.types import TokenEvent


class FakePanel:
    def __init__(self) -> None:
        self.shown: list[int] = []  # reply tokens of each meter update

    def set_context_usage(self, usage) -> None:
        self.shown.append(usage.reply_tokens)


class Clock:
    now = 100.0

    def monotonic(self) -> float:
        return self.now


def token(n: int = 1) -> list[TokenEvent]:
    return [TokenEvent("r1", "chat", list(range(n)), "x" * n, 0.0)]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(context_tracker, "time", fake)
    return fake


def test_a_streaming_count_reaches_the_meter_a_few_times_a_second_and_the_last_is_never_lost(clock: Clock) -> None:
    panel = FakePanel()
    context = ChatContext(panel)  # type: ignore[arg-type]
    for _ in range(30):  # 30 frames of one token within a sixtieth of a second each
        context.streamed(token())
        clock.now += 1 / 60
    assert context.usage.reply_tokens == 30  # the count is always current
    assert 1 <= len(panel.shown) <= 30 * (1 / 60) / STREAMING_SHOW_S + 1  # the meter: a few updates, not 30
    assert panel.shown[-1] < 30  # the newest count was held back ...
    status_refresh = PageMap(16, 64, (), frozenset(), {})
    context.pages(status_refresh, "r1")  # ... until anything else touches the meter (the 4 Hz status bar)
    assert panel.shown[-1] == 30
    context.streamed(token(2))
    context.finished({"output_tokens": 40})  # the end shows at once
    assert panel.shown[-1] == 40
