"""ChatBackend: what a chat tab needs from whatever writes its replies, and the registry tabs pick one from.

The local EngineThread satisfies the protocol as it is; a remote OpenAI-compatible endpoint (engine/remote/client.py)
plugs in by offering the same two calls and registering itself under its own id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from PySide6.QtCore import QObject, Signal

from engine.types import EventSink, SamplingParams

LOCAL = "local"


class ReplyHandle(Protocol):
    request_id: str

    def cancel(self) -> None: ...


class ChatBackend(Protocol):
    """submit() raises StudioError subclasses for bad requests in the caller's thread; everything after that
    arrives as TokenEvents through the request's sink (called in any thread), ending with one finished event.
    A backend whose tokenizer the chat counts with (the local engine: context_fit.limits_for) is also given the
    messages' prompt_ids, so that it need not encode them again."""

    def submit(self, *, messages: Sequence[dict], params: SamplingParams, tag: str, sink: EventSink) -> ReplyHandle: ...

    def cancel(self, request_id: str) -> None: ...


class BackendRegistry(QObject):
    """Backends by id. A backend is None while it can't take requests (its model is loading or being swapped);
    tabs queue their messages until it comes back."""

    backend_changed = Signal(str)  # the id whose backend appeared, changed or went away

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._backends: dict[str, ChatBackend | None] = {}
        self._labels: dict[str, str] = {}

    def set(self, backend_id: str, backend: ChatBackend | None, label: str = "") -> None:
        self._backends[backend_id] = backend
        if label:
            self._labels[backend_id] = label
        self.backend_changed.emit(backend_id)

    def get(self, backend_id: str) -> ChatBackend | None:
        return self._backends.get(backend_id)

    def label(self, backend_id: str) -> str:
        return self._labels.get(backend_id, backend_id)

    def ids(self) -> list[str]:
        return list(self._backends)
