"""The hooks colleagues build on: another chat backend (a remote endpoint) per tab, and the dashboard dock."""

from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace

from PySide6.QtWidgets import QLabel

from engine.domain.model_choice import ModelChoice
from engine.types import TokenEvent
from tests.app.conftest import settings, wait_idle


class FakeRemote:
    """What engine/remote/client.py offers: submit/cancel, each request's TokenEvents to its sink from its own
    thread."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.requests: list[list[dict]] = []
        self._ids = itertools.count(1)

    def submit(self, *, messages, params, tag, sink):
        request_id = f"remote-{next(self._ids)}"
        self.requests.append(list(messages))
        threading.Thread(target=self._reply, args=(request_id, tag, sink), daemon=True).start()
        return SimpleNamespace(request_id=request_id, cancel=lambda: self.cancel(request_id))

    def cancel(self, request_id: str) -> None:
        pass

    def _reply(self, request_id: str, tag: str, sink) -> None:
        for word in self.words:
            time.sleep(0.005)
            sink([TokenEvent(request_id, tag, [1], word, time.monotonic())])
        sink([TokenEvent(request_id, tag, [], "", time.monotonic(), True, "stop")])


def test_a_tab_can_chat_through_another_backend(qtbot, make_window) -> None:
    window = make_window()
    remote = FakeRemote(["Hello", " from", " far", " away."])
    window.registry.set("remote:test", remote, label="Test endpoint")
    local = window.tabs.current
    far = window.tabs.new_chat(settings(system_prompt="Be remote."))
    assert far.set_backend("remote:test")
    far.send("hi there")
    local.set_settings(settings(max_tokens=3))
    local.send("hello")
    wait_idle(qtbot, far, local)
    assert far.messages[-1].content == "Hello from far away." and far.messages[-1].finish_reason == "stop"
    assert remote.requests == [[{"role": "system", "content": "Be remote."}, {"role": "user", "content": "hi there"}]]
    assert local.messages[-1].error is None and local.messages[-1].content != far.messages[-1].content
    assert window.store.load_chat(far.chat_id).backend == "remote:test"
    assert far.panel.transcript.views[-1].stats_label.text() == ""  # no stats from this backend: none shown


def test_a_dashboard_widget_goes_into_the_view_dashboard_dock(make_window) -> None:
    window = make_window(load=False)
    assert window.bridge.metrics() is None
    panel = QLabel("dashboard")
    dock = window.install_dashboard(panel)
    assert not dock.isVisible() and window.dashboard is panel
    window.actions.dashboard.trigger()  # View > Dashboard
    assert dock.isVisible() and dock.widget() is panel


def test_a_first_model_that_fails_leaves_the_waiting_message_with_the_error(
    qtbot, make_window, tmp_path, tiny_choice
) -> None:
    window = make_window(load=False)
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=3))
    chat.send("hello")
    failures: list[str] = []
    window.bridge.model_load_failed.connect(failures.append)
    window.load_model(ModelChoice(spec=str(tmp_path / "nowhere")))
    qtbot.waitUntil(lambda: bool(failures), timeout=30_000)
    assert chat.panel.notice.isVisible() and "No model could be loaded" in chat.panel.notice.text
    assert chat.busy and not chat.streaming
    assert window.status.model.text() == "no model loaded"
    window.load_model(tiny_choice)
    wait_idle(qtbot, chat)
    assert chat.messages[-1].finish_reason in ("stop", "length") and not chat.panel.notice.isVisible()
