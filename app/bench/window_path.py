"""`bench --via window`: the real main window (offscreen) as a path of the benchmark: one chat tab per request, each
sending its message as a user does; a token counts when the window has shown it. Also measures the UI thread's load
and how long a keystroke in the message box waits while the replies stream."""

from __future__ import annotations

import collections
import gc
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, Qt, QTimer
from PySide6.QtGui import QInputDevice, QKeyEvent
from PySide6.QtWidgets import QApplication

from app.bench.window import EventWait, wait_events
from app.chat.store import ChatStore
from app.hosting.backends import LOCAL
from app.window.gui_collector import GuiCollector
from app.window.main_window import MainWindow
from app.window.self_test import isolate_user_data
from app.window.settings import StudioSettings
from engine.bench.engine_run import WAIT_LIMIT_S, engine_figures, exact_length
from engine.bench.results import RequestTiming, SystemResult, percentile
from engine.bench.workloads import BenchRequest, Workload
from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.engine_thread import EngineThread
from engine.domain.chat import ChatSettings
from engine.domain.model_choice import ModelChoice

WINDOW_SIZE = (1280, 800)  # the size the README's screenshots show; a maximised window paints more
TYPING_INTERVAL_S = 0.1  # a keystroke every 100 ms into the visible chat's message box (a fast typist)
GREEDY = ChatSettings(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0)


class ExactReplies:
    """The local engine as the chat tabs see it, except that each tab's request gets the benchmark's exact-length
    sampling (EOS banned until max tokens, as every other system of the benchmark), so all make the same tokens.
    Everything else is the window's own path: the tab's messages, encoded once by the engine's tokenizer as the tab
    counts them."""

    def __init__(self, thread: EngineThread, requests: dict[str, BenchRequest]) -> None:
        self._thread = thread
        self._requests = requests  # by the tab's title, which the tab sends as its tag

    def submit(self, *, messages, params, tag: str, sink, prompt_ids=None):
        return self._thread.submit(
            prompt_ids, messages=messages, params=exact_length(self._requests[tag]), tag=tag, sink=sink
        )

    def __getattr__(self, name: str):
        return getattr(self._thread, name)  # engine, cancel: as the engine thread has them


class TypingProbe:
    """A thread posts a key press to the message box every TYPING_INTERVAL_S, as the window system would deliver
    one; the latency is how long the UI thread took to put the character into the box."""

    def __init__(self, box) -> None:
        QInputDevice.primaryKeyboard()  # made once here: a key event made first in another thread would make it there
        self._box = box
        self._posted: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.latencies_ms: list[float] = []
        box.textChanged.connect(self._typed)
        self._thread = threading.Thread(target=self._type, name="bench-typist", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _type(self) -> None:
        while not self._stop.wait(TYPING_INTERVAL_S):
            with self._lock:
                self._posted.append(time.monotonic())
            event = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_A, Qt.KeyboardModifier.NoModifier, "a")
            QCoreApplication.postEvent(self._box, event)

    def _typed(self) -> None:  # UI thread
        now = time.monotonic()
        with self._lock:
            posted = self._posted.popleft() if self._posted else None
        if posted is not None:
            self.latencies_ms.append((now - posted) * 1e3)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        wait_events(0.2)  # the last keys still queued arrive
        self._box.textChanged.disconnect(self._typed)


def run_window(loaded, workload: Workload, config: EngineConfig, name: str = "engine-window") -> SystemResult:
    """One run of the workload through the main window; the window is new each run, the model the loaded one."""
    isolate_user_data()  # whatever else the window keeps (endpoints, panel choices) goes to a throwaway home
    app = QApplication.instance() or QApplication(["inference-studio"])
    collector = GuiCollector(interval=0.5)  # as the studio: Python's collector runs in the UI thread only
    folder = Path(tempfile.mkdtemp(prefix="inference-studio-bench-window-"))
    store = ChatStore(folder / "chats.sqlite3")
    window = MainWindow(StudioSettings(folder / "settings.ini"), store=store)
    try:
        return _drive(app, window, loaded, workload, config, name)
    finally:
        window.close()
        window.deleteLater()
        wait_events(0.1)
        collector.timer.stop()
        gc.enable()
        store.close()
        shutil.rmtree(folder, ignore_errors=True)  # each run's chats and settings: 73 of them were left in /tmp


def _drive(app, window: MainWindow, loaded, workload: Workload, config: EngineConfig, name: str) -> SystemResult:
    window.confirm = lambda title, question: True
    window.add_dashboard()  # the dashboard in its dock, as the studio opens it
    window.resize(*WINDOW_SIZE)
    window.show()
    engine = Engine(loaded, config)
    window.bridge.adopt(ModelChoice(spec=loaded.info.name), engine)
    tabs = window.tabs
    chats = [tabs.current or tabs.new_chat()]
    while len(chats) < len(workload.requests):
        chats.append(tabs.new_chat())
    requests = {chat.title: request for chat, request in zip(chats, workload.requests, strict=True)}
    window.registry.set(LOCAL, ExactReplies(window.bridge.thread, requests), label=loaded.info.name)
    for chat, request in zip(chats, workload.requests, strict=True):
        system = next((m["content"] for m in request.messages or [] if m["role"] == "system"), "")
        chat.set_settings(replace(GREEDY, system_prompt=system, max_tokens=request.max_new_tokens))
    wait_events(0.5)  # the window shows itself before the clock starts

    # a token counts once the window has handled it: this slot runs after the router's, which renders
    times: dict[str, list[float]] = {}
    outputs: dict[str, list[int]] = {}
    arrivals: dict[str, float] = {}
    finished: set[str] = set()
    by_tab: dict[str, str] = {}  # tab title -> request id
    all_shown = EventWait()  # the thread path waits on an event too: neither path polls while it is measured

    def shown(events) -> None:
        now = time.monotonic()
        for event in events:
            if event.request_id not in times:
                times[event.request_id], outputs[event.request_id] = [], []
                by_tab[event.tag] = event.request_id
            times[event.request_id].extend([now] * len(event.token_ids))
            outputs[event.request_id].extend(event.token_ids)
            if event.finished:
                finished.add(event.request_id)
                if len(finished) == len(workload.requests):
                    all_shown.done()
                if event.error:
                    raise RuntimeError(f"{event.tag} failed: {event.error}")

    window.pump.events_arrived.connect(shown)
    typing = TypingProbe(tabs.current.panel.input)
    start = time.monotonic()
    cpu = time.thread_time()

    def send(chat, request: BenchRequest) -> None:
        arrivals[chat.title] = time.monotonic()
        text = (request.messages or [{"content": ""}])[-1]["content"]
        if not chat.send(text):
            raise RuntimeError(f"{chat.title} did not send its message")

    for chat, request in zip(chats, workload.requests, strict=True):
        QTimer.singleShot(int(request.arrival_s * 1000), lambda c=chat, r=request: send(c, r))
    typing.start()
    all_shown.run(WAIT_LIMIT_S)
    busy = (time.thread_time() - cpu) / max(1e-9, time.monotonic() - start)
    typing.stop()
    if len(finished) < len(workload.requests):
        raise TimeoutError(f"the window did not finish the workload within {WAIT_LIMIT_S:.0f} s")
    order = [by_tab[chat.title] for chat in chats]
    timings = [RequestTiming(arrivals[chat.title], times[rid]) for chat, rid in zip(chats, order, strict=True)]
    wall = max(t.token_times[-1] for t in timings) - start
    typed = typing.latencies_ms
    extra = {
        "via": "window",
        "ui_thread_busy": busy,
        "typing_latency_p50_ms": percentile(typed, 50),
        "typing_latency_p99_ms": percentile(typed, 99),
        "typing_latency_max_ms": max(typed, default=None),
        "keystrokes": len(typed),
        **engine_figures(engine),
    }
    return SystemResult(name, wall, timings, [outputs[rid] for rid in order], extra)
