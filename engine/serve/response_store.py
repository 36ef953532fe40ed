"""The Responses API's memory for previous_response_id: finished responses and their conversations, kept for the
server's lifetime within a bound of count and characters, the least recently used forgotten first."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_RESPONSES = 1024
MAX_CHARS = 32 * 1024 * 1024  # about 32 MB of text, response objects and conversations together


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the Response object as answered
    messages: list[dict]  # the conversation it ended (chat messages, its own output included; no instructions)
    chars: int


class ResponseStore:
    """Thread-safe; a response larger than the whole bound is not kept (a later previous_response_id gets 400)."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def chars(self) -> int:
        return self._chars

    def put(self, response: dict, messages: list[dict]) -> None:
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(messages, ensure_ascii=False))
        if size > self.max_chars:
            return
        with self._lock:
            old = self._items.pop(response["id"], None)
            if old is not None:
                self._chars -= old.chars
            self._items[response["id"]] = StoredResponse(response, messages, size)
            self._chars += size
            while len(self._items) > self.max_responses or self._chars > self.max_chars:
                _, evicted = self._items.popitem(last=False)
                self._chars -= evicted.chars

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            found = self._items.get(response_id)
            if found is not None:
                self._items.move_to_end(response_id)
            return found
