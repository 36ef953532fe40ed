"""The window bench-ui measures: chat views fed token by token through a per-frame bridge, beside the dashboard."""

from __future__ import annotations

import threading

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QPlainTextEdit, QWidget

from engine.core.engine_thread import EngineThread
from engine.handle import RequestHandle
from engine.types import SamplingParams
from widgets.dashboard.dashboard import DashboardWidget
from widgets.dashboard.data.series import MemoryInfo

FRAME_MS = 33  # chat text is applied once per frame, as the studio's bridge does, not once per token
QUESTIONS = (
    "Explain how a bicycle stays upright.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
    "Describe how a compiler turns code into a program.",
    "Give advice for someone learning to cook.",
    "Why do cats purr?",
    "Summarise the plot of a heist film you invent.",
    "How does a heat pump work?",
)


def wait_events(seconds: float) -> None:
    """Run the Qt event loop for `seconds` (the UI keeps painting, timers keep firing)."""
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def wait_events_until(condition, seconds: float) -> None:
    """Run the Qt event loop until condition() is true (checked every 50 ms) or `seconds` have passed."""
    loop = QEventLoop()
    check = QTimer()
    check.timeout.connect(lambda: condition() and loop.quit())
    check.start(50)
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    check.stop()


class EventWait:
    """The Qt event loop run until done() is called or a time limit passes, with nothing polling in between: a poll
    wakes the UI thread, and on two cores each wake comes out of the engine's time the window is measured against."""

    def __init__(self) -> None:
        self._loop = QEventLoop()
        self.is_done = False

    def done(self) -> None:
        self.is_done = True
        self._loop.quit()

    def run(self, seconds: float) -> bool:
        """Whether done() was called (before this, or within `seconds`)."""
        if not self.is_done:
            limit = QTimer()
            limit.setSingleShot(True)
            limit.timeout.connect(self._loop.quit)
            limit.start(int(seconds * 1000))
            self._loop.exec()
            limit.stop()
        return self.is_done


class BenchWindow(QWidget):
    """Chats that keep streaming (a finished reply is followed by a new question) beside the dashboard."""

    def __init__(self, worker: EngineThread, weight_bytes: int, chats: int = 8, reply_tokens: int = 128) -> None:
        super().__init__()
        self.setWindowTitle("Inference Studio — bench-ui")
        self.worker = worker
        self.reply_tokens = reply_tokens
        self._pending: list = []
        self._lock = threading.Lock()
        self.tokens_made = 0  # counted in the engine thread, read under the lock
        self.views: dict[str, QPlainTextEdit] = {}
        self.handles: dict[str, RequestHandle] = {}
        grid_host = QWidget()
        grid = QGridLayout(grid_host)
        for i in range(chats):
            view = QPlainTextEdit()
            view.setReadOnly(True)
            view.setMaximumBlockCount(200)
            self.views[f"Chat {i + 1}"] = view
            grid.addWidget(view, i // 2, i % 2)
        engine = worker.engine
        self.dashboard = DashboardWidget(engine.metrics.snapshot, MemoryInfo(weight_bytes, engine.cache.nbytes))
        layout = QHBoxLayout(self)
        layout.addWidget(grid_host, 1)
        layout.addWidget(self.dashboard, 3)
        self.resize(1900, 1150)
        self.frame = QTimer(self)
        self.frame.setInterval(FRAME_MS)
        self.frame.timeout.connect(self._apply_events)
        self.frame.start()
        self._streaming = False
        self._asked = 0
        self.model_name = ""
        self._sink = self._on_events  # one object for all chats: the engine thread calls it once per step

    def _on_events(self, events) -> None:  # engine thread: only queue, never touch widgets
        with self._lock:
            self._pending.extend(events)
            self.tokens_made += sum(len(e.token_ids) for e in events)

    def token_count(self) -> int:
        with self._lock:
            return self.tokens_made

    def _apply_events(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        for event in events:
            view = self.views.get(event.tag)
            if view is None:
                continue
            if event.text:
                view.insertPlainText(event.text)
            if event.finished and self._streaming:
                self._ask(event.tag)

    def _ask(self, tag: str) -> None:
        question = QUESTIONS[self._asked % len(QUESTIONS)]
        self._asked += 1
        params = SamplingParams(max_tokens=self.reply_tokens, temperature=0.0, ignore_eos=True)
        self.views[tag].appendPlainText(f"\n> {question}\n")
        self.handles[tag] = self.worker.submit(
            messages=[{"role": "user", "content": question}], params=params, tag=tag, sink=self._sink
        )

    def start_streaming(self) -> None:
        """Every chat asks at once, and asks again whenever its reply ends."""
        self._streaming = True
        for tag in self.views:
            self._ask(tag)

    def stop_streaming(self) -> None:
        self._streaming = False
        for handle in self.handles.values():
            handle.cancel()

    def close(self) -> bool:
        closed = super().close()
        self.worker.shutdown()
        return closed

    def set_dashboard_visible(self, visible: bool) -> None:
        self.dashboard.setVisible(visible)

    def wait(self, seconds: float) -> None:
        wait_events(seconds)

    def wait_for(self, condition, seconds: float) -> None:
        wait_events_until(condition, seconds)
