"""The Responses API's answers: the Response object with its output items (messages, function calls), and the
stream of typed events with sequence numbers (response.created ... response.completed) the openai SDK reads."""

from __future__ import annotations

import time
import uuid

from engine.core.tools import ToolCall
from engine.serve.responses_request import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "open" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": _status(status), "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": _status(status)}  # fmt: skip


def _status(status: str) -> str:
    return "in_progress" if status == "open" else status


def output_items(text: str, calls: list[ToolCall], status: str) -> list[dict]:
    """A whole reply's output: its text as one message (if any), then each call."""
    items = [message_item(new_id("msg"), text, status)] if text else []
    items += [call_item(new_id("fc"), call.call_id, call.name, call.arguments, status) for call in calls]
    return items


def conversation_after(request: ResponsesRequest, output: list[dict]) -> list[dict]:
    """The chat messages a later previous_response_id continues: the input's, then this response's output."""
    messages = [dict(m) for m in request.conversation]
    text = "".join(c["text"] for item in output if item["type"] == "message" for c in item["content"])
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in output
        if i["type"] == "function_call"
    ]
    if text or calls:
        message: dict = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
    return messages


class ResponseObject:
    """The Response object of one request, as it is while running and when it ends."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.request = request
        self.id = new_id("resp")
        self.model = model
        self.created_at = int(time.time())

    def body(
        self,
        status: str,
        output: list[dict],
        usage: dict | None = None,
        *,
        incomplete: str | None = None,
        error: dict | None = None,
    ) -> dict:
        r, params = self.request, self.request.gen.params
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": r.instructions,
            "previous_response_id": r.previous_response_id,
            "tools": r.tools,
            "tool_choice": r.tool_choice,
            "parallel_tool_calls": r.parallel_tool_calls,
            "text": {"format": r.text_format},
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_output_tokens": r.max_output_tokens,
            "metadata": r.metadata or {},
            "store": r.store,
            "truncation": "disabled",
            "reasoning": None,
            "background": False,
            "user": None,
        }


class ResponseEvents:
    """The events of one streamed response, each with the next sequence number: created and in_progress, then per
    output item its added, deltas, done events, then completed (or failed)."""

    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self.sequence = 0
        self.output: list[dict] = []  # items so far (their final state once closed)
        self._text: dict | None = None  # the open message item
        self._text_so_far = ""
        self._calls: dict[int, dict] = {}  # the stream's call index -> its open item
        self._arguments: dict[int, str] = {}

    def _event(self, kind: str, **fields: object) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict]:
        running = self.response.body("in_progress", [])
        return [self._event("response.created", response=running), self._event("response.in_progress",
                                                                                response=running)]  # fmt: skip

    def text(self, delta: str) -> list[dict]:
        if not delta:
            return []
        events = self._close_calls()
        if self._text is None:
            item_id = new_id("msg")
            self._text = message_item(item_id, "", "open")
            self._text_so_far = ""
            index = len(self.output)
            self.output.append(self._text)
            events.append(self._event("response.output_item.added", output_index=index, item=self._text))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._event("response.content_part.added", item_id=item_id, output_index=index,
                                      content_index=0, part=part))  # fmt: skip
        self._text_so_far += delta
        index = self._index(self._text)
        events.append(self._event("response.output_text.delta", item_id=self._text["id"], output_index=index,
                                  content_index=0, delta=delta, logprobs=[]))  # fmt: skip
        return events

    def tool_deltas(self, deltas: list[dict]) -> list[dict]:
        """ToolCallStream's deltas: a new call (id and name), then its arguments in pieces."""
        events: list[dict] = []
        for delta in deltas:
            index = delta["index"]
            if "id" in delta:
                events += self._close_text() + self._close_calls()
                item = call_item(new_id("fc"), delta["id"], delta["function"]["name"], "", "open")
                self._calls[index], self._arguments[index] = item, ""
                self.output.append(item)
                events.append(self._event("response.output_item.added", output_index=self._index(item), item=item))
            piece = delta["function"].get("arguments") or ""
            if piece and index in self._calls:
                self._arguments[index] += piece
                item = self._calls[index]
                events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                          output_index=self._index(item), delta=piece))  # fmt: skip
        return events

    def finish(self, status: str, usage: dict, incomplete: str | None = None) -> list[dict]:
        """Close what is open (items cut off by max tokens end "incomplete") and end the response."""
        item_status = "incomplete" if incomplete else "completed"
        events = self._close_text(item_status) + self._close_calls(item_status)
        body = self.response.body(status, self.output, usage, incomplete=incomplete)
        # response.completed even when cut off (the status inside says incomplete), as vLLM sends it: the SDK's
        # stream helper and agent frameworks take the final response from this event alone
        return [*events, self._event("response.completed", response=body)]

    def fail(self, message: str) -> list[dict]:
        error = {"code": "server_error", "message": message}
        return [self._event("response.failed", response=self.response.body("failed", self.output, error=error))]

    def _index(self, item: dict) -> int:
        return next(i for i, existing in enumerate(self.output) if existing["id"] == item["id"])

    def _close_text(self, status: str = "completed") -> list[dict]:
        if self._text is None:
            return []
        item, text = self._text, self._text_so_far
        index = self._index(item)
        done = message_item(item["id"], text, status)
        self.output[index] = done
        self._text = None
        part = done["content"][0]
        return [
            self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                        text=text, logprobs=[]),
            self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part=part),
            self._event("response.output_item.done", output_index=index, item=done),
        ]  # fmt: skip

    def _close_calls(self, status: str = "completed") -> list[dict]:
        events: list[dict] = []
        for index, item in sorted(self._calls.items()):
            arguments = self._arguments[index]
            position = self._index(item)
            done = call_item(item["id"], item["call_id"], item["name"], arguments, status)
            self.output[position] = done
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=position, arguments=arguments))  # fmt: skip
            events.append(self._event("response.output_item.done", output_index=position, item=done))
        self._calls.clear()
        return events
