"""The Numbers panel after an experiment shows the chat engine's pool; the prefill stall on the panel and chart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.core.metrics import MetricsRecorder
from tests.widgets.synthetic import page_map, step
from widgets.dashboard.dashboard import DashboardWidget
from widgets.dashboard.data.series import MemoryInfo
from widgets.dashboard.panel import curve_data

T0 = 1000.0


@pytest.fixture
def dashboard(qtbot) -> DashboardWidget:
    widget = DashboardWidget(clock=lambda: T0 + 5.0, cpu_share=1.0)
    widget.timer.stop()
    qtbot.addWidget(widget)
    widget.resize(1200, 1100)
    widget.show()
    return widget


def test_after_an_experiment_the_numbers_show_the_chat_engines_pool(dashboard) -> None:
    chat = MetricsRecorder()
    chat.record_step(step(1, T0, decode=1, used=10, total=728))
    chat.publish_page_map(page_map({"r1": ([0, 1, 2], 10)}, 728, set(), {"r1": "Chat 1"}))
    dashboard.set_memory(MemoryInfo(kv_pool_bytes=1, kv_pages=728))
    dashboard.set_source(chat.snapshot, "engine")
    dashboard.redraw()
    assert dashboard.numbers.text("kv_pages") == "10 / 728"
    experiment = MetricsRecorder()  # its own small pool, and the newest steps
    experiment.record_step(step(1, T0 + 1, decode=3, used=40, total=72))
    dashboard.set_source(experiment.snapshot, "experiment: memory pressure")
    dashboard.redraw()
    assert dashboard.numbers.text("kv_pages") == "40 / 72"
    dashboard.set_source(chat.snapshot, "engine")  # the experiment ended; the chat engine ran no step since
    dashboard.redraw()
    assert dashboard.numbers.text("kv_pages") == "3 / 728"  # its page map, as the page map panel and status bar


def test_a_fresh_engine_without_steps_shows_its_pool_size(dashboard) -> None:
    experiment = MetricsRecorder()
    experiment.record_step(step(1, T0 + 1, decode=3, used=40, total=72))
    dashboard.set_source(experiment.snapshot, "experiment")
    dashboard.set_memory(MemoryInfo(kv_pages=728))
    dashboard.set_source(MetricsRecorder().snapshot, "engine")
    dashboard.redraw()
    assert dashboard.numbers.text("kv_pages") == "0 / 728"


def test_the_prefill_stall_shows_on_the_numbers_panel_and_the_chart(dashboard) -> None:
    recorder = MetricsRecorder()
    recorder.record_step(step(1, T0, decode=2))
    recorder.record_step(replace(step(2, T0 + 0.1, prefill=64, decode=2), prefill_stall_s=0.085))
    recorder.record_step(replace(step(3, T0 + 0.2, prefill=64, decode=2), prefill_stall_s=0.045))
    recorder.record_step(step(4, T0 + 0.3, decode=2))
    dashboard.set_source(recorder.snapshot, "engine")
    dashboard.redraw()
    assert dashboard.numbers.text("prefill_stall") == "85.0 ms · 0.13 s"
    _, stall = curve_data(dashboard.panels["prefill_decode"].stall_curve)
    assert stall.tolist() == pytest.approx([0.0, 85.0, 45.0, 0.0])
    quiet = MetricsRecorder()
    quiet.record_step(step(1, T0 + 1, decode=1))
    dashboard.clear()
    dashboard.set_source(quiet.snapshot, "engine 2")
    dashboard.redraw()
    assert dashboard.numbers.text("prefill_stall") == "–"
