"""The event pump hands a frame's events over at once, and a reply's first and last events without the frame's wait."""

from __future__ import annotations

import threading
import time

from app.chat.event_pump import EventPump
from engine.types import FinishReason, TokenEvent

LONG_FRAME_MS = 2000  # a frame far longer than the waits below: what arrives sooner came without it


def token(request_id: str, text: str) -> TokenEvent:
    return TokenEvent(request_id, "tab", [1], text, time.monotonic())


def test_a_replys_first_and_last_events_come_at_once_the_rest_with_the_frame(qtbot) -> None:
    pump = EventPump(frame_ms=LONG_FRAME_MS)
    batches: list[list[str]] = []
    pump.events_arrived.connect(lambda events: batches.append([e.text for e in events]))

    def sink_from_an_engine_thread(events) -> None:
        thread = threading.Thread(target=pump.sink, args=(events,))
        thread.start()
        thread.join(timeout=5)

    started = time.monotonic()
    sink_from_an_engine_thread([token("r1", "Hello")])
    qtbot.waitUntil(lambda: batches == [["Hello"]], timeout=LONG_FRAME_MS // 4)
    sink_from_an_engine_thread([token("r1", ",")])
    sink_from_an_engine_thread([token("r1", " world")])
    qtbot.wait(LONG_FRAME_MS // 4)
    assert batches == [["Hello"]]  # the tokens between wait for the frame, together
    end = TokenEvent.ending("r1", FinishReason.STOP, tag="tab")
    sink_from_an_engine_thread([end])
    qtbot.waitUntil(lambda: len(batches) == 2, timeout=LONG_FRAME_MS // 4)
    assert batches[1] == [",", " world", ""]  # the end brings what waited, in order
    assert time.monotonic() - started < LONG_FRAME_MS / 1000
    qtbot.wait(LONG_FRAME_MS + 200)  # the frame that was due delivers nothing twice
    assert len(batches) == 2


def test_a_second_request_starting_mid_frame_is_shown_at_once_too(qtbot) -> None:
    pump = EventPump(frame_ms=LONG_FRAME_MS)
    batches: list[list[str]] = []
    pump.events_arrived.connect(lambda events: batches.append([e.request_id for e in events]))
    pump.sink([token("a", "x")])
    qtbot.waitUntil(lambda: len(batches) == 1, timeout=LONG_FRAME_MS // 4)
    pump.sink([token("a", "y")])
    pump.sink([token("b", "z")])  # another tab's first token
    qtbot.waitUntil(lambda: len(batches) == 2, timeout=LONG_FRAME_MS // 4)
    assert batches == [["a"], ["a", "b"]]
