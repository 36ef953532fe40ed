"""A reply's text as it streams, split into plain content and tool calls: content passes on at once, a tool call's
name and then its arguments go out as OpenAI's tool_call deltas while the model writes them (as vLLM streams them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.tools import CLOSE, OPEN, new_call_id, open_tag_overlap, scan_calls


@dataclass
class _Call:
    index: int
    name: str
    call_id: str = field(default_factory=new_call_id)
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
                    content.append(self._take(len(self._pending) - open_tag_overlap(self._pending, OPEN)))
                    break
                content.append(self._take(start))
                self._take(len(OPEN))
                self._block, self._block_start = "", len(self.calls)
            end = self._pending.find(CLOSE)
            if end < 0:
                self._block += self._take(len(self._pending) - open_tag_overlap(self._pending, CLOSE))
                deltas += self._progress()
                break
            self._block += self._take(end)
            self._take(len(CLOSE))
            deltas += self._progress()
            self._block = None
        return "".join(content), deltas

    def finish(self, cut: bool = False) -> tuple[str, list[dict]]:
        """The reply ended: what is still held back, as content, and the last deltas. A block that never named a call
        is text after all, unless the reply was cut off (max tokens): a block left open is then a call with the
        arguments written so far, or nothing, never markup in the content (parse_calls(cut=True) reads it alike)."""
        deltas: list[dict] = []
        rest, self._pending = self._pending, ""
        if self._block is not None and cut:
            self._block += rest
            deltas, rest = self._progress(), ""
        elif cut:  # held back as the possible start of a call's tag: markup all the same
            rest = ""
        elif self._block is not None and len(self.calls) == self._block_start:
            rest = OPEN + self._block + rest
        self._block = None
        return rest, deltas

    def _take(self, count: int) -> str:
        taken, self._pending = self._pending[:count], self._pending[count:]
        return taken

    def _progress(self) -> list[dict]:
        """Deltas for what the block says beyond what was sent: a new call's name, then its arguments' text."""
        assert self._block is not None
        deltas: list[dict] = []
        for position, (name, arguments) in enumerate(scan_calls(self._block)):
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
