"""bench-ui's run: the studio (or plain text views) streaming while the dashboard is shown and hidden in turn."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.bench.studio import StudioBench
from app.bench.ui_report import STALL_TICK_MS, Phase, summarize
from app.bench.window import BenchWindow
from app.cli.options import MIB, engine_options_from, load_options_from
from engine.core.engine_thread import EngineThread
from engine.domain.model_choice import ModelChoice
from engine.launch import start_engine

WARM_UP_LIMIT_S = 120.0
SETTLE_S = 1.0  # after showing or hiding the dashboard (a full repaint, saved-up credit), before a phase counts


class StallProbe:
    """A precise timer that should fire every STALL_TICK_MS; how late it fires is how long the loop was blocked."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._last: float | None = None
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(STALL_TICK_MS)
        self.timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.samples.append(max(0.0, (now - self._last) * 1e3 - STALL_TICK_MS))
        self._last = now

    def start(self) -> None:
        self.samples, self._last = [], None
        self.timer.start()

    def stop(self) -> list[float]:
        self.timer.stop()
        return self.samples


def run_bench(args: argparse.Namespace) -> int:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    bench = _plain_bench(args) if args.plain else _studio_bench(args)
    probe = StallProbe()
    phases: list[Phase] = []
    try:
        bench.start_streaming()
        # warm-up: until every chat streams (first calls are slow; a fresh studio engine starts slowly too)
        bench.wait_for(lambda: bench.token_count() >= args.chats * 32, WARM_UP_LIMIT_S)
        bench.wait(2.0)
        if args.screenshot:
            bench.grab().save(args.screenshot)
        for i in range(args.phases):
            visible = i % 2 == 0  # alternate in short phases, so drifts in machine load hit both sides alike
            bench.set_dashboard_visible(visible)
            bench.wait(SETTLE_S)
            tokens, cpu, started = bench.token_count(), time.thread_time(), time.perf_counter()
            probe.start()
            bench.wait(args.phase_seconds)
            stalls = probe.stop()
            wall = time.perf_counter() - started
            cpu = time.thread_time() - cpu
            phases.append(Phase("visible" if visible else "hidden", bench.token_count() - tokens, wall, cpu, stalls))
        bench.stop_streaming()
    finally:
        bench.close()
    report = summarize(phases, bench.model_name, args)
    report.panel_cost_ms = {k: round(bench.dashboard.budget.cost(k) * 1e3, 1) for k in bench.dashboard.panels}
    print(json.dumps(asdict(report)) if args.json else "\n".join(report.lines()))
    del app
    return 0


def _studio_bench(args: argparse.Namespace):
    kv_memory_mib = 0 if args.kv_memory is None else int(args.kv_memory * 1024**2) // MIB  # 0: automatic
    choice = ModelChoice.of(args.model or "default", load_options_from(args), kv_memory_mib)
    return StudioBench(choice, chats=args.chats)


def _plain_bench(args: argparse.Namespace):
    engine = start_engine(engine_options_from(args))
    window = BenchWindow(EngineThread(engine).start(), engine.loaded.info.weight_bytes, chats=args.chats)
    window.model_name = engine.loaded.info.name
    window.show()
    return window
