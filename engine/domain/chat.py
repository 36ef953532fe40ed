"""Chats: messages, per-chat settings and their one mapping to the engine's sampling parameters, presets."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import TypeVar

from engine.domain.json_schema import schema_problem
from engine.domain.reply_stats import ReplyStats
from engine.types import PENALTY_LIMIT, FinishReason, SamplingParams, StructuredOutput

E = TypeVar("E", bound=StrEnum)

USER = "user"
ASSISTANT = "assistant"

#: what a reply saved while it streamed says once reopened, if the studio stopped before the reply finished (the
#: reply's row keeps no finish reason until it ends; its final save replaces this)
INTERRUPTED = "Interrupted: the studio stopped before this reply was finished."


@dataclass
class ChatMessage:
    role: str
    content: str
    stats: ReplyStats | None = None
    finish_reason: FinishReason | None = None  # None while streaming, and for the user's messages
    error: str | None = None
    created: float = field(default_factory=time.time)

    @property
    def in_context(self) -> bool:
        """Whether the message goes back to the model: failed replies with no text would only confuse it."""
        return bool(self.content.strip())

    def to_dict(self) -> dict:
        return {**asdict(self), "stats": self.stats.to_dict() if self.stats is not None else None}

    def __post_init__(self) -> None:
        # stored and exported as an object: read back typed (a hand-edited file's odd values read as unknown)
        if self.stats is not None and not isinstance(self.stats, ReplyStats):
            self.stats = ReplyStats.from_dict(self.stats)
        # stored and exported as text; an unknown value (a newer studio's) reads as a plain stop
        if self.finish_reason is not None and not isinstance(self.finish_reason, FinishReason):
            try:
                self.finish_reason = FinishReason(self.finish_reason)
            except ValueError:
                self.finish_reason = FinishReason.STOP

    @classmethod
    def from_dict(cls, data: dict) -> ChatMessage:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def format_stats(message: ChatMessage) -> str:
    """One line under a reply: tokens, time to first token, decode speed, prompt tokens found in the cache."""
    stats = message.stats or ReplyStats()
    parts = []
    if stats.output_tokens is not None:
        parts.append(f"{stats.output_tokens} tokens")
    if stats.ttft_s is not None:
        parts.append(f"TTFT {stats.ttft_s * 1000:.0f} ms")
    if stats.decode_tokens_per_s:
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
    if stats.prompt_tokens is not None:
        parts.append(f"{stats.cached_prompt_tokens or 0}/{stats.prompt_tokens} prompt tokens cached")
    if message.finish_reason is FinishReason.ABORT:
        parts.append("stopped")
    elif message.finish_reason is FinishReason.LENGTH:
        parts.append("stopped at the end of the context" if stats.context_full else "hit the token limit")
    return " · ".join(parts)


class OverflowPolicy(StrEnum):
    """What a chat does when its conversation outgrows the model's context."""

    STOP = "stop"  # send nothing more; a notice says so (the default: nothing is dropped silently)
    TRUNCATE_MIDDLE = "truncate_middle"  # keep the system prompt and the first exchange, drop turns after it
    ROLLING = "rolling_window"  # keep the system prompt and the latest turns

    @property
    def label(self) -> str:
        return _OVERFLOW_LABELS[self]


_OVERFLOW_LABELS = {
    OverflowPolicy.STOP: "stop with a notice",
    OverflowPolicy.TRUNCATE_MIDDLE: "truncate the middle",
    OverflowPolicy.ROLLING: "rolling window",
}


class OutputKind(StrEnum):
    """What a chat's replies must be: any text, any JSON object, or JSON that follows a schema."""

    TEXT = "text"
    JSON = "json"
    SCHEMA = "json_schema"

    @property
    def label(self) -> str:
        return _OUTPUT_LABELS[self]


_OUTPUT_LABELS = {OutputKind.TEXT: "Free text", OutputKind.JSON: "JSON", OutputKind.SCHEMA: "JSON schema"}
#: top alternatives asked for each token while a chat shows token probabilities
TOKEN_ALTERNATIVES = 5


@dataclass(frozen=True)
class ChatSettings:
    """What one chat sends with each request: its system prompt and sampling settings."""

    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    max_tokens: int = 512
    seed: int | None = None
    repetition_penalty: float = 1.1
    presence_penalty: float = 0.0  # OpenAI's, over the reply's own tokens (-2 to 2)
    frequency_penalty: float = 0.0
    overflow: OverflowPolicy = OverflowPolicy.STOP
    output: OutputKind = OutputKind.TEXT
    #: the last valid schema the user typed (kept while the output is something else, so switching back restores it)
    json_schema: str = ""
    show_tokens: bool = False  # ask for each token's probability and its top alternatives

    def __post_init__(self) -> None:
        # stored as text: a newer studio's policy or kind, or a hand-edited file, reads as the default
        object.__setattr__(self, "overflow", _member(OverflowPolicy, self.overflow, OverflowPolicy.STOP))
        object.__setattr__(self, "output", _member(OutputKind, self.output, OutputKind.TEXT))
        if not isinstance(self.json_schema, str) or schema_problem(self.json_schema):
            object.__setattr__(self, "json_schema", "")  # a hand-edited file: never send a bad schema
        object.__setattr__(self, "show_tokens", bool(self.show_tokens))
        for name in ("presence_penalty", "frequency_penalty"):  # a hand-edited file: a number in [-2, 2], or off
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            object.__setattr__(self, name, min(PENALTY_LIMIT, max(-PENALTY_LIMIT, float(value))) if ok else 0.0)

    def structured(self) -> StructuredOutput | None:
        """The constraint replies are written under; a schema output with no valid schema yet writes free text."""
        if self.output is OutputKind.JSON:
            return StructuredOutput("json_object")
        if self.output is OutputKind.SCHEMA and self.json_schema:
            return StructuredOutput("json_schema", json.dumps(json.loads(self.json_schema)))
        return None

    def to_params(self) -> SamplingParams:
        """The engine's sampling parameters for one request of this chat (the one place they are mapped)."""
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            structured=self.structured(),
            logprobs=TOKEN_ALTERNATIVES if self.show_tokens else None,
        )

    def with_preset(self, name: str) -> ChatSettings:
        return replace(self, **PRESETS[name])

    def preset_name(self) -> str | None:
        """The preset these settings match, if any (the panel shows 'custom' otherwise)."""
        for name, values in PRESETS.items():
            if all(getattr(self, key) == value for key, value in values.items()):
                return name
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ChatSettings:
        if not data:
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _member(kind: type[E], value: object, default: E) -> E:
    try:
        return kind(value)
    except (ValueError, TypeError):
        return default


#: Sampling presets; they leave the system prompt and the token limit alone.
_NO_PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0}
PRESETS: dict[str, dict] = {
    "precise": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0, **_NO_PENALTIES},
    "balanced": {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "repetition_penalty": 1.1, **_NO_PENALTIES},
    "creative": {"temperature": 1.1, "top_p": 0.98, "top_k": 0, "repetition_penalty": 1.05, **_NO_PENALTIES},
}


def conversation(system_prompt: str, messages: list[ChatMessage]) -> list[dict]:
    """The messages sent to the model: the system prompt, then every message that has text."""
    out = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    out.extend({"role": m.role, "content": m.content} for m in messages if m.in_context)
    return out


@dataclass(frozen=True)
class ChatSummary:
    """A stored chat as the history list shows it."""

    chat_id: int
    title: str
    updated: float
    message_count: int
    preview: str
    is_open: bool
