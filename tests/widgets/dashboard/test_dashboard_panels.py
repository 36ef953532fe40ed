"""Dashboard panels fed synthetic metrics: what each one plots (data arrays, not pixels), and the controls."""

from __future__ import annotations

import numpy as np
import pytest

from tests.widgets.synthetic import step, token, two_chat_recorder
from widgets.dashboard.dashboard import DashboardWidget
from widgets.dashboard.data.series import MemoryInfo
from widgets.dashboard.data.theme import DARK, LIGHT, blend, chat_colour
from widgets.dashboard.panel import curve_data

T0 = 1000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def recorder():
    return two_chat_recorder(T0)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 + 0.6)


@pytest.fixture
def dashboard(qtbot, recorder, clock) -> DashboardWidget:
    widget = DashboardWidget(
        recorder.snapshot,
        MemoryInfo(weight_bytes=512 * 1024**2, kv_pool_bytes=64 * 1024**2),
        clock=clock,
        cpu_share=1.0,  # no redraw budget: every tick draws every panel that is out of date
    )
    widget.timer.stop()  # the tests tick by hand
    qtbot.addWidget(widget)
    widget.resize(1200, 1100)
    widget.show()
    widget.tick()
    return widget


def test_prefill_decode_panel_stacks_step_times_and_marks_requests(dashboard) -> None:
    panel = dashboard.panels["prefill_decode"]
    x, decode = curve_data(panel.decode_curve)
    # times are seconds before now (T0 + 0.6)
    assert x.tolist() == pytest.approx([-0.6, -0.5, -0.4, -0.3, -0.25, -0.2, -0.15])
    assert decode.tolist() == pytest.approx([0.0, 40.0, 3.2, 40.0, 40.0, 40.0, 40.0])
    _, decode_plus_prefill = curve_data(panel.prefill_curve)
    assert decode_plus_prefill[:3].tolist() == pytest.approx([90.0, 40.0, 80.0])
    _, total = curve_data(panel.total_curve)
    assert total[0] == pytest.approx(100.0)  # duration 0.1 s: 90 ms prefill + 10 ms outside the forward pass
    _, tokens = curve_data(panel.prefill_tokens_curve)
    assert tokens[:3].tolist() == [20, 1, 25]
    admitted = panel.markers["admitted"].getData()
    assert admitted[0].tolist() == pytest.approx([-0.5, -0.3]) and admitted[1].tolist() == pytest.approx([100.0, 100.0])
    assert panel.markers["preempted"].getData()[0].tolist() == pytest.approx([-0.15])
    assert panel.markers["finished"].getData()[0].tolist() == pytest.approx([-0.1])


def test_throughput_panel_plots_token_rate_and_running_batch(dashboard) -> None:
    panel = dashboard.panels["throughput"]
    centres, rate = curve_data(panel.rate_curve)
    assert rate.sum() * 1.0 == pytest.approx(8 / 0.6)  # 8 tokens, all in the newest 1 s bin that has run 0.6 s
    assert centres[-1] == pytest.approx(-0.1)
    _t, running = curve_data(panel.running_curve)
    assert running.tolist() == [1, 1, 2, 2, 2, 1, 1]
    assert curve_data(panel.waiting_curve)[1].tolist() == [0, 0, 0, 0, 0, 1, 0]


def test_streaming_panel_plots_each_chats_tokens_and_ttft(dashboard, qtbot) -> None:
    panel = dashboard.panels["streaming"]
    assert set(panel.itl_by_chat) == {"alpha", "beta"}
    t_alpha, itl_alpha = curve_data(panel.itl_curves[0])
    assert t_alpha.tolist() == pytest.approx([-0.45, -0.4, -0.35, -0.3]) and itl_alpha.tolist() == pytest.approx(
        [50] * 4
    )
    assert curve_data(panel.itl_curves[1])[1].tolist() == pytest.approx([80, 80])
    assert sorted(panel.data["ttft_ms"].tolist()) == pytest.approx([100.0, 150.0])
    assert panel.data["histogram_counts"].sum() == 6  # every later token once
    panel.chat_box.setCurrentText("beta")
    dashboard.redraw()
    assert set(panel.itl_by_chat) == {"beta"}
    assert curve_data(panel.itl_curves[0])[0].size == 0
    assert panel.data["ttft_ms"].tolist() == pytest.approx([150.0])


def test_kv_pages_panel_stacks_used_cached_free_and_marks_preemptions(dashboard, recorder) -> None:
    recorder.record_step(step(8, T0 + 0.5, used=10, cached=6, total=32))
    dashboard.tick()
    panel = dashboard.panels["kv_pages"]
    _, used = curve_data(panel.used_curve)
    _, used_cached = curve_data(panel.cached_curve)
    _, everything = curve_data(panel.free_curve)
    assert used[-1] == 10 and used_cached[-1] == 16 and everything[-1] == 32
    assert curve_data(panel.total_curve)[1].tolist() == [32] * 8
    assert panel.preempt_markers.getData()[0].tolist() == pytest.approx([-0.15])


def test_page_map_colours_cells_by_owner_and_marks_shared_pages(dashboard) -> None:
    panel = dashboard.panels["page_map"]
    assert [panel.cell_state(p) for p in range(6)] == ["shared", "shared", "used", "used", "cached", "free"]
    assert panel.owners_of(0) == ["alpha", "beta"] and panel.owners_of(3) == ["beta"]
    theme = panel.theme
    assert panel.cell_colours[1] == chat_colour(0)  # full page of alpha (first owner)
    assert panel.cell_colours[2] == blend(chat_colour(0), theme.page_free, 0.55 * 0.5)  # half full: paler
    assert panel.cell_colours[3] == blend(chat_colour(1), theme.page_free, 0.55 * 0.75)
    assert panel.cell_colours[4] == theme.page_cached and panel.cell_colours[5] == theme.page_free
    assert len(panel.shared_markers.getData()[0]) == 2
    assert "alpha (req-a)" in panel.describe_page(2) and "2/4 tokens" in panel.describe_page(2)
    assert "shared" in panel.describe_page(0) and "beta (req-b)" in panel.describe_page(0)
    assert panel.describe_page(4).startswith("page 4: free, keeps a cached prefix")
    assert panel.describe_page(5) == "page 5: free"
    assert panel.page_at(0, 0) == 0 and panel.page_at(-5, 0) is None


def test_numbers_panel_shows_the_window_summary(dashboard) -> None:
    n = dashboard.numbers
    assert n.text("ttft_p50") == "125 ms" and n.text("ttft_p99") == "150 ms"
    assert n.text("itl_p50") == "50.0 ms" and n.text("itl_p99") == "80.0 ms"
    assert n.text("stream_rate") == "20.0"
    assert n.text("prefix_hits") == "27%"
    assert n.text("kv_waste") == "31% · 5"
    assert n.text("preemptions") == "1"
    assert n.text("kv_pages") == "4 / 32"
    assert n.text("weights") == "512 MiB" and n.text("kv_memory") == "8/64 MiB"


def test_time_window_drops_what_is_older(dashboard, recorder, clock) -> None:
    recorder.record_step(step(8, T0 + 100.0, decode=1))
    recorder.record_tokens([token("req-c", "gamma", T0 + 100.0, 3, 0.2)])
    clock.now = T0 + 101.0
    dashboard.tick()
    panel = dashboard.panels["prefill_decode"]
    assert curve_data(panel.decode_curve)[0].tolist() == pytest.approx([-1.0])
    assert dashboard.numbers.text("ttft_p50") == "–"
    dashboard.window_box.setCurrentText("last 2 min")
    assert dashboard.window_s == 120.0
    assert len(curve_data(panel.decode_curve)[0]) == 8


def test_pause_freezes_the_charts_while_recording_goes_on(dashboard, recorder, clock) -> None:
    dashboard.pause_button.click()
    assert dashboard.paused and dashboard.pause_button.text() == "Resume"
    recorder.record_step(step(8, T0 + 0.55, decode=5))
    clock.now += 1
    dashboard.tick()
    panel = dashboard.panels["prefill_decode"]
    assert len(curve_data(panel.decode_curve)[0]) == 7
    assert dashboard.history.steps.size == 8  # read, not drawn
    dashboard.pause_button.click()
    assert len(curve_data(panel.decode_curve)[0]) == 8


def test_clear_empties_every_chart(dashboard) -> None:
    dashboard.clear()
    assert curve_data(dashboard.panels["prefill_decode"].decode_curve)[0].size == 0
    assert curve_data(dashboard.panels["streaming"].histogram_curve)[1].sum() == 0
    assert dashboard.numbers.text("ttft_p50") == "–"


def test_hidden_panels_are_not_redrawn(dashboard, recorder) -> None:
    dashboard.set_panel_visible("throughput", False)
    assert "throughput" not in dashboard.visible_panels()
    action = next(a for a in dashboard.panel_menu.actions() if a.text() == "Throughput")
    assert not action.isChecked()
    recorder.record_step(step(8, T0 + 0.55, running=7))
    dashboard.tick()
    assert curve_data(dashboard.panels["throughput"].running_curve)[1].size == 7
    action.setChecked(True)
    assert curve_data(dashboard.panels["throughput"].running_curve)[1][-1] == 7


def test_a_hidden_dashboard_keeps_reading_but_draws_nothing(dashboard, recorder) -> None:
    dashboard.hide()
    assert dashboard.timer.interval() == 1000
    recorder.record_step(step(8, T0 + 0.55, decode=1))
    dashboard.tick()
    assert dashboard.history.steps.size == 8
    assert len(curve_data(dashboard.panels["prefill_decode"].decode_curve)[0]) == 7


def test_switching_source_marks_the_change_and_continues(dashboard, clock) -> None:
    from engine.core.metrics import MetricsRecorder

    other = MetricsRecorder()
    other.record_step(step(1, T0 + 0.58, prefill=7))
    dashboard.set_source(other.snapshot, "experiment: batching")
    assert dashboard.source_label.text() == "experiment: batching"
    assert dashboard.history.steps.size == 8
    assert dashboard.history.annotations[-1][1] == "experiment: batching"


def test_export_writes_png_csv_and_json(dashboard, tmp_path) -> None:
    dashboard.set_panel_visible("numbers", False)
    png = dashboard.export_png(tmp_path / "charts.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert next(p.name for p in dashboard.export_csv(tmp_path / "m.csv")) == "m-steps.csv"
    assert dashboard.export_json(tmp_path / "m.json").stat().st_size > 100


def test_experiment_results_show_in_their_panel(dashboard) -> None:
    assert "results" not in dashboard.visible_panels()
    dashboard.show_experiment_result("Batching", ["streams", "tok/s"], [["1", "10.0"], ["4", "31.5"]], ["a note"])
    assert "results" in dashboard.visible_panels()
    assert dashboard.results.cells() == [["1", "10.0"], ["4", "31.5"]]


def test_dark_palette_switches_the_theme(dashboard) -> None:
    from PySide6.QtGui import QColor, QPalette

    palette = QPalette()
    palette.setColor(QPalette.ColorRole.Window, QColor("#202124"))
    dashboard.setPalette(palette)
    assert dashboard.theme is DARK
    panel = dashboard.panels["page_map"]
    assert panel.cell_colours[5] == DARK.page_free
    assert LIGHT.page_free != DARK.page_free
    assert np.isfinite(curve_data(dashboard.panels["kv_pages"].used_curve)[1]).all()


def test_experiment_phases_are_marked_on_the_time_charts(dashboard, clock) -> None:
    from engine.core.metrics import MetricsRecorder

    other = MetricsRecorder()
    other.record_step(step(1, T0 + 0.58, prefill=7))
    dashboard.set_source(other.snapshot, "experiment: batching")
    dashboard.redraw()
    marks = dashboard.panels["prefill_decode"].phases
    assert [text for _, text in marks.marks] == ["batching"]
    x, _ = marks.lines.getData()
    assert x.tolist() == pytest.approx([0.0, 0.0])  # one vertical line, at the switch (now)
    assert marks.labels[0].isVisible()


def test_a_failing_panel_is_logged_and_the_dashboard_goes_on(dashboard, recorder, caplog) -> None:
    def broken(view) -> None:
        raise ValueError("a bug in a panel")

    dashboard.panels["throughput"].refresh = broken
    recorder.record_step(step(8, T0 + 0.55, decode=1))
    dashboard.tick()  # the timer's slot: must not raise into Qt
    dashboard.tick()
    assert "a bug in a panel" in caplog.text
    assert dashboard.history.steps.size == 8
    assert len(curve_data(dashboard.panels["kv_pages"].used_curve)[0]) == 8  # the others still draw


def test_remote_panel_plots_what_the_server_reports_or_says_it_reports_nothing(dashboard, clock) -> None:
    from engine.remote.metrics import RemoteMetricsSnapshot, unavailable

    panel = dashboard.remote
    assert panel.isHidden()  # chats on this computer: nothing remote to show
    dashboard.set_remote("llama-70b @ cluster")
    assert not panel.isHidden() and "reading its /metrics" in panel.status.text()
    first = RemoteMetricsSnapshot(True, "vLLM-style metrics", 0.0, kv_cache_usage=0.25, running=3, waiting=1)
    dashboard.add_remote_metrics(first)
    dashboard.add_remote_metrics(first)  # the client hands out its last scrape until the next one: kept once
    clock.now += 1.0
    second = RemoteMetricsSnapshot(True, "vLLM-style metrics", 1.0, kv_cache_usage=0.5, running=4, waiting=0,
                                   ttft_mean_s=0.12)  # fmt: skip
    dashboard.add_remote_metrics(second)
    dashboard.redraw()
    assert panel.graphics.isVisibleTo(panel) and "what the server reports" in panel.status.text()
    assert panel.data["t"].tolist() == [-1.0, 0.0]  # seconds before now, on the same axis as the other charts
    assert panel.data["kv_percent"].tolist() == [25.0, 50.0]
    assert panel.data["running"].tolist() == [3, 4] and panel.data["waiting"].tolist() == [1, 0]
    assert np.isnan(panel.data["ttft_ms"][0]) and panel.data["ttft_ms"][1] == pytest.approx(120.0)
    # a server without vLLM-style metrics: say so, draw no empty charts
    dashboard.set_remote("qwen @ ollama")
    dashboard.add_remote_metrics(unavailable("the endpoint serves no vLLM-style /metrics"))
    dashboard.redraw()
    assert "only client-side timings are available" in panel.status.text()
    assert not panel.graphics.isVisibleTo(panel) and panel.data["t"].size == 0
    dashboard.set_remote(None)
    assert panel.isHidden() and "remote" not in dashboard.visible_panels()


def test_a_panel_class_without_build_or_refresh_is_refused_when_defined() -> None:
    from widgets.dashboard.panel import Panel

    with pytest.raises(TypeError, match="must define build and refresh"):

        class Empty(Panel):
            pass

    class Complete(Panel):
        def build(self) -> None:
            pass

        def refresh(self, view) -> None:
            pass


def test_streaming_panel_marks_accepted_draft_tokens_apart(qtbot, clock) -> None:
    """Speculative decoding: tokens that came as accepted drafts get their own series and legend entry."""
    from dataclasses import replace

    from engine.core.metrics import MetricsRecorder

    recorder = MetricsRecorder()
    recorder.record_step(step(1, T0, prefill=8, admitted=("req-s",)))
    records = [token("req-s", "spec", T0 + 0.1, 0, 0.1)]
    for i in range(1, 7):  # every other token came with the one before it: a draft accepted in the same step
        drafted = i % 2 == 0
        records.append(replace(token("req-s", "spec", T0 + 0.1 + 0.05 * i, i, 0.0005 if drafted else 0.05),
                               drafted=drafted))  # fmt: skip
    recorder.record_tokens(records)
    widget = DashboardWidget(recorder.snapshot, MemoryInfo(), clock=clock, cpu_share=1.0)
    widget.timer.stop()
    qtbot.addWidget(widget)
    widget.resize(1000, 900)
    widget.show()
    widget.tick()
    panel = widget.panels["streaming"]
    x, y = panel.draft_markers.getData()
    assert x.tolist() == pytest.approx([-0.4, -0.3, -0.2])  # seconds before now (T0 + 0.6)
    assert y.tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert panel.data["drafted_ms"].size == 3
    assert "accepted draft (3 tokens)" in panel.legend.text()
    assert curve_data(panel.itl_curves[0])[0].size == 6  # drafts stay on the chat's own line too


def test_streaming_panel_names_no_drafts_without_speculation(dashboard) -> None:
    panel = dashboard.panels["streaming"]
    assert panel.draft_markers.getData()[0].size == 0
    assert "accepted draft" not in panel.legend.text()
