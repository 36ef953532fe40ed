"""The dashboard on a real engine thread (tiny model): two chats stream, the page map shows both, then frees."""

from __future__ import annotations

import time

import pytest

from engine.types import SamplingParams
from widgets.dashboard.dashboard import DashboardWidget
from widgets.dashboard.data.series import MemoryInfo
from widgets.dashboard.panel import curve_data


@pytest.fixture
def worker(tiny_loaded_for_widgets):
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.core.engine_thread import EngineThread

    engine = Engine(tiny_loaded_for_widgets, EngineConfig(kv_pages=128, page_size=4))
    thread = EngineThread(engine).start()
    yield thread
    thread.shutdown()


def test_two_chats_stream_into_the_page_map_and_free_it(qtbot, worker, monkeypatch) -> None:
    engine = worker.engine
    # the 10 Hz poll must catch both chats holding pages however fast the kernels make 120 tokens: 5 ms a step
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda: (time.sleep(0.005), step())[1])
    dashboard = DashboardWidget(engine.metrics.snapshot, MemoryInfo(1, engine.cache.nbytes))
    qtbot.addWidget(dashboard)
    dashboard.resize(1200, 1000)
    dashboard.show()
    page_map = dashboard.panels["page_map"]
    # long replies (ignore EOS), paced above, so the 10 Hz poll surely catches both chats holding pages at once
    params = SamplingParams(max_tokens=120, ignore_eos=True)
    first = worker.submit([5, 6, 7, 8, 9, 10, 11], params=params, tag="Chat A")
    second = worker.submit([12, 13, 14, 15, 16], params=params, tag="Chat B")

    def both_hold_pages() -> bool:
        holders = {tag for p in range(len(page_map.cell_colours)) for tag in page_map.owners_of(p)}
        return holders == {"Chat A", "Chat B"}

    qtbot.waitUntil(both_hold_pages, timeout=30_000)
    assert page_map.counts["used"] >= 2
    first.result(timeout=60)
    second.result(timeout=60)

    def all_returned() -> bool:
        # panels redraw in turns (the redraw budget), so each is waited for
        _, used = curve_data(dashboard.panels["kv_pages"].used_curve)
        return (
            page_map.page_map is not None
            and page_map.counts["used"] + page_map.counts["shared"] == 0
            and len(used) > 0
            and used[-1] == 0
            and dashboard.numbers.text("kv_pages") == "0 / 128"
        )

    qtbot.waitUntil(all_returned, timeout=10_000)
    assert page_map.counts["free"] + page_map.counts["cached"] == 128
    assert curve_data(dashboard.panels["kv_pages"].used_curve)[1].max() >= 2
    streaming = dashboard.panels["streaming"]
    qtbot.waitUntil(lambda: len(streaming.itl_by_chat.get("Chat A", ((),))[0]) == 119, timeout=5_000)
    assert len(streaming.itl_by_chat["Chat B"][0]) == 119  # every token after the first, as it arrived
    assert sorted(streaming.ttft_by_chat) == ["Chat A", "Chat B"]
