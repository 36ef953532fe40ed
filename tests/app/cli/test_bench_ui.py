"""bench-ui's arithmetic: each shown phase against the hidden ones beside it, stall percentiles (no timing here)."""

from __future__ import annotations

import pytest

from app.bench.ui_report import Phase, summarize
from app.cli.main import build_parser


def test_the_command_is_there_with_its_options() -> None:
    args = build_parser().parse_args(["bench-ui", "--phases", "4", "--phase-seconds", "1", "--plain", "--json"])
    assert (args.phases, args.phase_seconds, args.plain, args.json, args.chats) == (4, 1.0, True, True, 8)


def test_ratio_compares_each_shown_phase_with_its_hidden_neighbours() -> None:
    # throughput drifts down from 100 to 70 tok/s; the dashboard costs 10% whenever it is shown
    rates = [100 * 0.9, 95, 90 * 0.9, 85, 80 * 0.9, 75]
    phases = [
        Phase(
            "visible" if i % 2 == 0 else "hidden",
            int(rate * 3),
            3.0,
            0.3 if i % 2 == 0 else 0.03,
            [1.0] * 98 + [40.0, 60.0],
        )
        for i, rate in enumerate(rates)
    ]
    args = build_parser().parse_args(["bench-ui"])
    report = summarize(phases, "tiny", args)
    # the mean of both neighbours cancels a linear drift: 90/95, 81/90, 72/80 -> median 0.9, the true cost
    assert report.ratio == pytest.approx(0.9)
    assert report.stall_p50_ms == 1.0 and report.stall_max_ms == 60.0
    assert report.stall_p99_ms == 40.0
    assert report.ui_busy_visible == pytest.approx(0.1) and report.ui_busy_hidden == pytest.approx(0.01)
    assert "ratio 0.900" in "\n".join(report.lines())
