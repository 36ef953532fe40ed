"""EngineStatus: keeps the status bar's KV pages and running/waiting requests current, a few times a second."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer

from app.chat.tabs import ChatTabs
from app.hosting.engine_bridge import EngineBridge
from engine.core.metrics import StepRecord
from widgets.status_bar import StudioStatusBar

INTERVAL_MS = 250


class EngineStatus(QObject):
    def __init__(self, bar: StudioStatusBar, bridge: EngineBridge, tabs: ChatTabs, parent: QObject) -> None:
        super().__init__(parent)
        self._bar = bar
        self._bridge = bridge
        self._tabs = tabs
        self._step_cursor = 0
        self._last_step: StepRecord | None = None
        self._timer = QTimer(self, interval=INTERVAL_MS)
        self._timer.timeout.connect(self.refresh)
        self._timer.start()
        bridge.model_changed.connect(self._reset)
        # a chat starting or ending refreshes once the event loop is back: sixteen tabs sending at once refreshed
        # every tab's meter sixteen times over before the last one's message went out
        self._soon = QTimer(self, singleShot=True, interval=0)
        self._soon.timeout.connect(self.refresh)
        tabs.busy_changed.connect(self._soon.start)

    def stop(self) -> None:
        self._timer.stop()
        self._soon.stop()

    def _reset(self, _info=None) -> None:
        self._step_cursor = 0  # a new engine numbers its steps from zero
        self._last_step = None
        self.refresh()

    def refresh(self) -> None:
        recorder = self._bridge.metrics()
        thread = self._bridge.thread
        if recorder is None or thread is None:
            self._bar.set_engine_state(0, 0, 0, 0, self._tabs.held_by)
            return
        # only steps since the last look; per-token records are the dashboard's business
        snapshot = recorder.snapshot(since_step=self._step_cursor, since_token=1 << 62)
        self._step_cursor = snapshot.next_step
        if snapshot.steps:
            self._last_step = snapshot.steps[-1]
        page_map = snapshot.page_map
        self._tabs.update_kv_pages(page_map)  # each chat's context meter counts its own pages
        if page_map is not None:  # published on every admit, finish and abort: fresher than the last step
            used = len({page for _rid, table, _computed in page_map.tables for page in table})
            total = page_map.num_pages
        else:
            used, total = 0, thread.engine.pool.num_pages
        running = waiting = 0
        # the last step was recorded before the last reply ended; with no reply under way nothing runs
        if self._tabs.busy_count(None) and self._last_step is not None:
            running, waiting = self._last_step.running, self._last_step.waiting
        held_by = self._tabs.held_by
        if held_by is not None:  # the engine runs something else between steps: every chat on it waits
            running, waiting = 0, self._tabs.busy_count()
        self._bar.set_engine_state(used, total, running, waiting, held_by)
