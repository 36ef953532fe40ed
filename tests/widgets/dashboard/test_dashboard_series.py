"""Dashboard aggregation without Qt: cursors, windows, percentiles, rates, the prefill/decode split, KV waste."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.metrics import MetricsRecorder
from tests.widgets.synthetic import page_map, step, token, two_chat_recorder
from widgets.dashboard.data.series import ColumnTable, MetricsHistory
from widgets.dashboard.data.stats import (
    itl_histogram,
    kv_waste,
    percentile,
    step_time_split,
    summarize,
    token_rate,
)

T0 = 1000.0


def test_column_table_grows_and_drops_without_losing_rows() -> None:
    table = ColumnTable(("a", "b"), capacity=2)
    table.extend([(i, i * 10) for i in range(5)])
    table.extend([(5, 50)])
    assert table.column("a").tolist() == [0, 1, 2, 3, 4, 5]
    table.drop_first(4)
    assert table.column("b").tolist() == [40, 50]
    table.extend([])
    assert table.size == 2


def test_each_poll_reads_only_what_is_new() -> None:
    recorder = two_chat_recorder(T0)
    seen: list[tuple[int, int]] = []

    def source(since_step: int, since_token: int):
        seen.append((since_step, since_token))
        return recorder.snapshot(since_step, since_token)

    history = MetricsHistory()
    assert history.poll(source)
    assert history.steps.size == 7 and history.tokens.size == 8
    assert not history.poll(source)  # nothing new: nothing changed, nothing appended
    recorder.record_step(step(8, T0 + 0.5, decode=1))
    assert history.poll(source)
    assert seen == [(0, 0), (7, 8), (7, 8)]
    assert history.steps.size == 8 and history.tokens.size == 8


def test_sources_keep_their_own_cursors_and_the_history_continues() -> None:
    first, second = two_chat_recorder(T0), MetricsRecorder()
    second.record_step(step(1, T0 + 5.0, decode=1))
    history = MetricsHistory()
    history.poll(first.snapshot)
    history.annotate(T0 + 4.9, "experiment")
    history.poll(second.snapshot)
    assert history.steps.column("step").tolist() == [1, 2, 3, 4, 5, 6, 7, 1]
    history.poll(first.snapshot)  # back to the first: its cursor was kept, nothing is read twice
    assert history.steps.size == 8
    assert history.window(60, T0 + 6).annotations == [(pytest.approx(-1.1), "experiment")]


def test_window_holds_only_recent_records_relative_to_now() -> None:
    history = MetricsHistory()
    history.poll(two_chat_recorder(T0).snapshot)
    view = history.window(0.2, now=T0 + 0.5)
    assert view.steps["t"].tolist() == pytest.approx([-0.2, -0.15, -0.1, -0.05])
    assert view.tokens["t"].min() >= -0.2
    assert (view.start, view.end) == (-0.2, 0.0)
    assert view.since_origin == pytest.approx(0.5)
    assert view.chats == ["alpha", "beta"]
    assert history.window(0.01, now=T0 + 100).num_steps == 0


def test_events_come_from_step_records() -> None:
    history = MetricsHistory()
    history.poll(two_chat_recorder(T0).snapshot)
    kinds = history.events.column("kind").tolist()
    assert kinds == [0, 0, 2, 1]  # admitted a, admitted b, preempted b, finished a
    assert [history.request_ids[int(r)] for r in history.events.column("request")] == [
        "req-a",
        "req-b",
        "req-b",
        "req-a",
    ]


def test_old_records_are_dropped_past_the_retention() -> None:
    recorder = MetricsRecorder()
    for i in range(2000):
        recorder.record_step(step(i + 1, T0 + i, decode=1))
    history = MetricsHistory(retention_s=100)
    history.poll(recorder.snapshot)
    assert history.steps.size < 2000
    assert history.window(100, now=T0 + 1999).num_steps == 101


def test_clear_forgets_records_but_not_cursors() -> None:
    recorder = two_chat_recorder(T0)
    history = MetricsHistory()
    history.poll(recorder.snapshot)
    history.clear()
    assert history.steps.size == 0 and history.tokens.size == 0 and not history.finished
    history.poll(recorder.snapshot)
    assert history.steps.size == 0  # what was read before the clear is not read again
    assert history.chats == ["alpha", "beta"]  # chats keep their colours


def test_finished_requests_are_merged_once() -> None:
    recorder = two_chat_recorder(T0)
    history = MetricsHistory()
    history.poll(recorder.snapshot)
    recorder.record_finished({"request_id": "req-b", "tag": "beta", "output_tokens": 3})
    history.poll(recorder.snapshot)
    assert list(history.finished) == ["req-a", "req-b"]


def test_percentile_interpolates_and_is_none_without_data() -> None:
    assert percentile(np.array([]), 50) is None
    assert percentile(np.arange(1, 101, dtype=float), 50) == pytest.approx(50.5)
    assert percentile(np.arange(1, 101, dtype=float), 99) == pytest.approx(99.01)
    assert percentile(np.array([0.2]), 99) == pytest.approx(0.2)


def test_prefill_and_decode_time_split_by_tokens_in_mixed_steps() -> None:
    history = MetricsHistory()
    history.poll(two_chat_recorder(T0).snapshot)
    split = step_time_split(history.window(10, T0 + 1))
    # step 1 is pure prefill, step 2 pure decode, step 3 mixes 24 prefill tokens with 1 decode token
    assert split.prefill_s[:3] == pytest.approx([0.09, 0.0, 0.08 * 24 / 25])
    assert split.decode_s[:3] == pytest.approx([0.0, 0.04, 0.08 / 25])
    assert split.other_s[:3] == pytest.approx([0.01, 0.01, 0.02])


def test_token_rate_bins_sit_on_whole_multiples() -> None:
    recorder = MetricsRecorder()
    recorder.record_step(step(1, T0, decode=1))
    recorder.record_tokens([token("r", "c", T0 + i * 0.1, i, 0.1) for i in range(30)])  # 10 tok/s for 3 s
    history = MetricsHistory()
    history.poll(recorder.snapshot)
    centres, rate = token_rate(history.window(4.0, T0 + 3.0), bin_s=1.0)
    assert centres.tolist() == pytest.approx([-3.5, -2.5, -1.5, -0.5])
    assert rate.tolist() == [0.0, 10.0, 10.0, 10.0]


def test_itl_histogram_counts_every_latency() -> None:
    edges, counts = itl_histogram(np.array([0.01, 0.02, 0.02, 0.5]), bins=10)
    assert counts.sum() == 4 and len(edges) == 11 and edges[0] == 0.0
    assert itl_histogram(np.array([]))[1].sum() == 0


def test_kv_waste_is_the_unfilled_tail_of_held_pages() -> None:
    pm = page_map({"a": ([0, 1], 5), "b": ([0, 2], 7)}, 4, {0, 3}, {"a": "x", "b": "y"})
    assert pm.owners == (("a", "b"), ("a",), ("b",), ())
    assert kv_waste(pm) == (3 + 1, 12)  # page 1 holds 1 of 4 tokens, page 2 holds 3
    assert kv_waste(None) == (0, 0)


def test_summary_of_two_chats() -> None:
    history = MetricsHistory()
    history.poll(two_chat_recorder(T0).snapshot)
    summary = summarize(history.window(10, T0 + 1))
    assert summary.ttft_p50_s == pytest.approx(0.125)
    assert summary.ttft_p99_s == pytest.approx(0.1495)
    assert summary.itl_p50_s == pytest.approx(0.05)
    assert summary.stream_tokens_per_s == pytest.approx(20.0)
    assert summary.output_tokens_per_s == pytest.approx(8 / 0.45)  # 8 tokens in 0.45 s of steps
    assert summary.prefix_hit_rate == pytest.approx(16 / 60)
    assert summary.preemptions == 1
    assert (summary.kv_waste_slots, summary.kv_allocated_slots) == (5, 16)
    assert summary.pages_used == 4 and summary.pages_total == 32


def test_a_chats_line_breaks_between_its_replies() -> None:
    from widgets.dashboard.data.stats import chat_latencies

    recorder = MetricsRecorder()
    recorder.record_step(step(1, T0, decode=1))
    recorder.record_tokens(
        [token("r1", "chat", T0 + i, i, 0.1) for i in range(3)]
        + [token("r2", "chat", T0 + 5 + i, i, 0.1) for i in range(3)]
    )
    history = MetricsHistory()
    history.poll(recorder.snapshot)
    chat = chat_latencies(history.window(30, T0 + 10), 0)
    assert chat.t.tolist() == pytest.approx([-9, -8, -4, -3])
    assert chat.joined.tolist() == [True, False, True, False]
    assert chat.ttft_s.tolist() == [0.1, 0.1]
