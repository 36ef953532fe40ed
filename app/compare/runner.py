"""CompareRun: one comparison under way: local targets in the engine thread one after another, remote ones at once
on their clients; every event comes back to the GUI thread as a signal, tagged with its column."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from PySide6.QtCore import QObject, Signal

from app.compare.targets import CompareTarget
from engine.errors import StudioError
from engine.experiments.compare import run_local_targets
from engine.handle import RequestHandle
from engine.types import SamplingParams, TokenEvent


class CompareRun(QObject):
    event_arrived = Signal(int, object)  # column, TokenEvent (from any thread; queued to this one)
    status_changed = Signal(int, str)
    tokenizer_known = Signal(int, str)
    finished = Signal()

    def __init__(
        self,
        targets: Sequence[CompareTarget],
        messages: list[dict],
        params: SamplingParams,
        worker,  # the EngineThread, or None while no model is loaded
        clients: dict,  # backend id -> RemoteClient
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.targets = list(targets)
        self._messages = messages
        self._params = params
        self._worker = worker
        self._clients = clients
        self._cancel = threading.Event()
        self._open = set(range(len(self.targets)))  # columns whose final event has not come
        self._remote: dict[int, RequestHandle] = {}  # column -> its remote request
        self.event_arrived.connect(self._track)

    def start(self) -> None:
        local = [(i, t) for i, t in enumerate(self.targets) if t.local is not None]
        for index, target in enumerate(self.targets):
            if target.backend_id is not None:
                self._start_remote(index, target)
        if local:
            self._start_local(local)

    def _start_local(self, local: list[tuple[int, CompareTarget]]) -> None:
        columns = [i for i, _ in local]
        worker = self._worker
        if worker is None or not worker.alive:
            for column in columns:
                self._end(column, "no model is loaded: local targets run on the loaded engine's thread")
            return
        for column in columns[1:]:
            self.status_changed.emit(column, "waiting for its turn (local targets run one after another)…")

        def run(engine) -> None:
            run_local_targets(
                engine,
                [t.local for _, t in local],
                self._messages,
                self._params,
                on_event=lambda k, event: self.event_arrived.emit(columns[k], event),
                on_status=lambda k, text: self.status_changed.emit(columns[k], text),
                on_tokenizer=lambda k, key: self.tokenizer_known.emit(columns[k], key),
                cancelled=self._cancel,
            )

        worker.call(run)

    def _start_remote(self, index: int, target: CompareTarget) -> None:
        client = self._clients.get(target.backend_id)
        if client is None:
            self._end(index, "this endpoint is no longer available")
            return

        def sink(events: list[TokenEvent]) -> None:  # the client's thread: hand over, nothing else
            for event in events:
                self.event_arrived.emit(index, event)

        try:
            handle = client.submit(messages=self._messages, params=self._params, tag=target.label, sink=sink)
        except StudioError as exc:
            self._end(index, str(exc))
            return
        self._remote[index] = handle
        self.status_changed.emit(index, "writing…")

    def _end(self, index: int, error: str) -> None:
        event = TokenEvent.failed(f"compare-{index}", error, at=0.0)
        self.event_arrived.emit(index, event)

    def _track(self, index: int, event: TokenEvent) -> None:
        if not event.finished or index not in self._open:
            return
        self._open.discard(index)
        self._remote.pop(index, None)
        if not self._open:
            self.finished.emit()

    @property
    def running(self) -> bool:
        return bool(self._open)

    def cancel(self) -> None:
        self._cancel.set()
        for handle in list(self._remote.values()):
            handle.cancel()
