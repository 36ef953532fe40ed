"""A reply's text as it streams, split into plain content and tool calls: content passes on at once, a tool call's
name and then its arguments go out as OpenAI's tool_call deltas while the model writes them (as vLLM streams them)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from engine.core.tools import CLOSE, OPEN

_DECODER = json.JSONDecoder()


@dataclass
class _Call:
    index: int
    name: str
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    arguments_sent: int = 0  # characters of the arguments' text sent so far


class ToolCallStream:
    """feed(text) -> (content, deltas): the text to show now, and tool_call delta objects for a chat chunk."""

    def __init__(self) -> None:
        self._pending = ""  # text held back: it may be the start (or end) of a call block
        self._block: str | None = None  # inside <tool_call>...</tool_call>: the block's text so far
        self._block_start = 0  # index of the block's first call
        self.calls: list[_Call] = []

    @property
    def called(self) -> bool:
        """The reply made at least one call (its finish_reason is then tool_calls)."""
        return bool(self.calls)

    def feed(self, text: str) -> tuple[str, list[dict]]:
        content: list[str] = []
        deltas: list[dict] = []
        self._pending += text
        while self._pending:
            if self._block is None:
                start = self._pending.find(OPEN)
                if start < 0:
                    content.append(self._take(len(self._pending) - _overlap(self._pending, OPEN)))
                    break
                content.append(self._take(start))
                self._take(len(OPEN))
                self._block, self._block_start = "", len(self.calls)
            end = self._pending.find(CLOSE)
            if end < 0:
                self._block += self._take(len(self._pending) - _overlap(self._pending, CLOSE))
                deltas += self._progress()
                break
            self._block += self._take(end)
            self._take(len(CLOSE))
            deltas += self._progress()
            self._block = None
        return "".join(content), deltas

    def finish(self) -> str:
        """The reply ended: what is still held back, as content (a block that never named a call is text after all)."""
        rest, self._pending = self._pending, ""
        if self._block is not None and len(self.calls) == self._block_start:
            rest = OPEN + self._block + rest
        self._block = None
        return rest

    def _take(self, count: int) -> str:
        taken, self._pending = self._pending[:count], self._pending[count:]
        return taken

    def _progress(self) -> list[dict]:
        """Deltas for what the block says beyond what was sent: a new call's name, then its arguments' text."""
        assert self._block is not None
        deltas: list[dict] = []
        for position, (name, arguments) in enumerate(_scan(self._block)):
            index = self._block_start + position
            if index == len(self.calls):
                if name is None:
                    break
                call = _Call(index, name)
                self.calls.append(call)
                deltas.append({"index": index, "id": call.call_id, "type": "function",
                               "function": {"name": name, "arguments": ""}})  # fmt: skip
            call = self.calls[index]
            if arguments is not None and len(arguments) > call.arguments_sent:
                deltas.append({"index": index, "function": {"arguments": arguments[call.arguments_sent :]}})
                call.arguments_sent = len(arguments)
        return deltas


def _overlap(text: str, marker: str) -> int:
    """How many characters at the end of text could begin the marker (held back until the next piece decides)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _scan(block: str) -> list[tuple[str | None, str | None]]:
    """The calls in a (partial) block: each one's name once complete, and its arguments' text so far (all of it
    once closed). Reads {"name": "...", "arguments": {...}} objects, in a list or alone."""
    calls: list[tuple[str | None, str | None]] = []
    position = 0
    while (key := block.find('"name"', position)) >= 0:
        colon = block.find(":", key)
        quote = block.find('"', colon + 1) if colon >= 0 else -1
        try:
            name, after = _DECODER.raw_decode(block, quote) if quote >= 0 else (None, 0)
        except json.JSONDecodeError:
            name = None
        if not isinstance(name, str):
            calls.append((None, None))
            return calls
        key = block.find('"arguments"', after)
        colon = block.find(":", key) if key >= 0 else -1
        if colon < 0:
            calls.append((name, None))
            return calls
        start = colon + 1
        while start < len(block) and block[start] in " \t\r\n":
            start += 1
        end = _value_end(block, start)
        calls.append((name, block[start : len(block) if end is None else end]))
        if end is None:
            return calls
        position = end
    return calls


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON object (or string) starting at `start` ends, or None while it is still open."""
    if start >= len(text):
        return None
    if text[start] != "{":
        try:
            return _DECODER.raw_decode(text, start)[1]
        except json.JSONDecodeError:
            return None
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None
