"""The window bench-ui measures: chat views fed token by token through a per-frame bridge, beside the dashboard."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QPlainTextEdit, QWidget

from engine.request import SamplingParams
from engine.worker import EngineThread
from widgets.dashboard.dashboard import DashboardWidget
from widgets.dashboard.series import MemoryInfo

FRAME_MS = 33  # chat text is applied once per frame, as the studio's bridge does, not once per token


class BenchWindow(QWidget):
    def __init__(self, worker: EngineThread, weight_bytes: int, chats: int = 8) -> None:
        super().__init__()
        self.setWindowTitle("Inference Studio — bench-ui")
        self.worker = worker
        self._pending: list = []
        self._lock = threading.Lock()
        self.views: dict[str, QPlainTextEdit] = {}
        grid_host = QWidget()
        grid = QGridLayout(grid_host)
        for i in range(chats):
            view = QPlainTextEdit()
            view.setReadOnly(True)
            self.views[f"Chat {i + 1}"] = view
            grid.addWidget(view, i // 2, i % 2)
        engine = worker.engine
        self.dashboard = DashboardWidget(engine.metrics.snapshot, MemoryInfo(weight_bytes, engine.cache.nbytes))
        layout = QHBoxLayout(self)
        layout.addWidget(grid_host, 1)
        layout.addWidget(self.dashboard, 3)
        self.resize(1900, 1150)
        worker.add_listener(self._on_events)  # engine thread: only queue, never touch widgets
        self.frame = QTimer(self)
        self.frame.setInterval(FRAME_MS)
        self.frame.timeout.connect(self._apply_events)
        self.frame.start()

    def _on_events(self, events) -> None:
        with self._lock:
            self._pending.extend(events)

    def _apply_events(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        for event in events:
            view = self.views.get(event.tag)
            if view is not None and event.text:
                view.insertPlainText(event.text)

    def run_round(self, tokens: int, screenshot: str | None = None) -> tuple[int, float]:
        """Every chat asks at once and streams `tokens` tokens; returns (tokens made, wall seconds)."""
        from app.bench_ui import QUESTIONS

        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        self._apply_events()  # the end of the last round first, then a clean page
        for view in self.views.values():
            view.clear()
        started = time.monotonic()
        asks = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(len(self.views))]
        handles = [self.worker.submit(messages=m, params=params, tag=t) for m, t in zip(asks, self.views, strict=True)]
        loop = QEventLoop()
        check = QTimer()
        check.setInterval(20)
        shot_taken = screenshot is None

        def poll() -> None:
            nonlocal shot_taken
            done = sum(h.done for h in handles)
            if not shot_taken and done == 0 and sum(len(h.token_ids) for h in handles) > tokens * len(handles) // 2:
                self.grab().save(screenshot)
                shot_taken = True
            if done == len(handles):
                loop.quit()

        check.timeout.connect(poll)
        check.start()
        loop.exec()
        check.stop()
        finished = max(h.final.time for h in handles if h.final is not None)
        return sum(len(h.token_ids) for h in handles), finished - started
