"""The studio itself under bench-ui: the main window with chat tabs that keep streaming, the dashboard in its dock."""

from __future__ import annotations

import threading

from app.bench.window import QUESTIONS, wait_events, wait_events_until
from app.window.main_window import MainWindow
from app.window.self_test import isolate_user_data
from app.window.settings import StudioSettings
from engine.domain.chat import ChatSettings
from engine.domain.model_choice import ModelChoice

REPLY = ChatSettings(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0, max_tokens=128)


class StudioBench:
    """Opens the main window on a model, `chats` tabs that each ask again when their reply ends, and the
    dashboard dock; counts the tokens the engine makes."""

    def __init__(self, model: ModelChoice, chats: int = 8) -> None:

        isolate_user_data()  # a throwaway home: the bench's chats and settings never mix with the user's
        self.window = MainWindow(StudioSettings())
        self.window.confirm = lambda title, question: True
        self.dashboard = self.window.add_dashboard()
        self.window.resize(1900, 1150)
        self.window.show()
        self.window.actions.dashboard.trigger()  # View > Dashboard
        self._lock = threading.Lock()
        self._tokens = 0
        self._streaming = False
        self._asked = 0
        self.window.load_model(model)
        self.wait_for(lambda: self.window.bridge.thread is not None, 300.0)
        self.window.pump.events_arrived.connect(self._count)  # every chat's events, once per frame
        self.chats = [self.window.tabs.current or self.window.tabs.new_chat()]
        while len(self.chats) < chats:
            self.chats.append(self.window.tabs.new_chat())
        for chat in self.chats:
            chat.set_settings(REPLY)
            chat.busy_changed.connect(lambda busy, chat=chat: busy or self._ask(chat))

    @property
    def weight_bytes(self) -> int:
        return self.window.bridge.info.weight_bytes

    @property
    def model_name(self) -> str:
        return self.window.bridge.info.name

    def _count(self, events) -> None:  # UI thread
        with self._lock:
            self._tokens += sum(len(e.token_ids) for e in events)

    def token_count(self) -> int:
        with self._lock:
            return self._tokens

    def _ask(self, chat) -> None:
        if self._streaming:
            question = QUESTIONS[self._asked % len(QUESTIONS)]
            self._asked += 1
            chat.send(question)

    def start_streaming(self) -> None:
        self._streaming = True
        for chat in self.chats:
            self._ask(chat)

    def stop_streaming(self) -> None:
        self._streaming = False
        for chat in self.chats:
            chat.stop()

    def set_dashboard_visible(self, visible: bool) -> None:
        self.window.dashboard_dock.setVisible(visible)

    def grab(self):
        return self.window.grab()

    def wait(self, seconds: float) -> None:
        wait_events(seconds)

    def wait_for(self, condition, seconds: float) -> None:
        wait_events_until(condition, seconds)

    def close(self) -> None:
        self.window.close()
