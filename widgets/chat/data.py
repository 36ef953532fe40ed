"""Plain chat data shared by the views and the app: messages, per-chat settings, sampling presets."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace

import llguidance

from engine.types import PENALTY_LIMIT, FinishReason, RequestStats, SamplingParams, StructuredOutput

USER = "user"
ASSISTANT = "assistant"

#: RequestStats fields kept with a reply (the per-token latencies would bloat the store)
STAT_FIELDS = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "output_tokens",
    "ttft_s",
    "decode_tokens_per_s",
    "e2e_s",
    "preemptions",
)


#: what a reply saved while it streamed says once reopened, if the studio stopped before the reply finished (the
#: reply's row keeps no finish reason until it ends; its final save replaces this)
INTERRUPTED = "Interrupted: the studio stopped before this reply was finished."


@dataclass
class ChatMessage:
    role: str
    content: str
    stats: dict | None = None
    finish_reason: FinishReason | None = None  # None while streaming, and for the user's messages
    error: str | None = None
    created: float = field(default_factory=time.time)

    @property
    def in_context(self) -> bool:
        """Whether the message goes back to the model: failed replies with no text would only confuse it."""
        return bool(self.content.strip())

    def to_dict(self) -> dict:
        return asdict(self)

    def __post_init__(self) -> None:
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


def stats_dict(stats: RequestStats | None) -> dict | None:
    if stats is None:
        return None
    return {name: getattr(stats, name) for name in STAT_FIELDS}


def format_stats(message: ChatMessage) -> str:
    """One line under a reply: tokens, time to first token, decode speed, prompt tokens found in the cache."""
    stats = message.stats or {}
    parts = []
    if stats.get("output_tokens") is not None:
        parts.append(f"{stats['output_tokens']} tokens")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s'] * 1000:.0f} ms")
    if stats.get("decode_tokens_per_s"):
        parts.append(f"{stats['decode_tokens_per_s']:.1f} tok/s")
    if stats.get("prompt_tokens") is not None:
        parts.append(f"{stats.get('cached_prompt_tokens') or 0}/{stats['prompt_tokens']} prompt tokens cached")
    if message.finish_reason is FinishReason.ABORT:
        parts.append("stopped")
    elif message.finish_reason is FinishReason.LENGTH:
        parts.append("stopped at the end of the context" if stats.get("context_full") else "hit the token limit")
    return " · ".join(parts)


# what a chat does when its conversation outgrows the model's context
OVERFLOW_STOP = "stop"  # send nothing more; a notice says so (the default: nothing is dropped silently)
OVERFLOW_TRUNCATE_MIDDLE = "truncate_middle"  # keep the system prompt and the first exchange, drop turns after it
OVERFLOW_ROLLING = "rolling_window"  # keep the system prompt and the latest turns
OVERFLOW_POLICIES = {
    OVERFLOW_STOP: "stop with a notice",
    OVERFLOW_TRUNCATE_MIDDLE: "truncate the middle",
    OVERFLOW_ROLLING: "rolling window",
}


# what a chat's replies must be: any text, any JSON object, or JSON that follows a schema
OUTPUT_TEXT = "text"
OUTPUT_JSON = "json"
OUTPUT_SCHEMA = "json_schema"
OUTPUT_KINDS = {OUTPUT_TEXT: "Free text", OUTPUT_JSON: "JSON", OUTPUT_SCHEMA: "JSON schema"}
#: top alternatives asked for each token while a chat shows token probabilities
TOKEN_ALTERNATIVES = 5
_SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def schema_problem(text: str) -> str | None:
    """Why a JSON schema typed by the user can't be used (one line), or None when it can: well-formed JSON, an object,
    and what the engine's grammar compiler (llguidance) accepts, at every level (an unknown type deep inside, a $ref to
    nothing)."""
    if not text.strip():
        return 'Type a JSON schema, e.g. {"type": "object", "properties": {…}}'
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        return "Not valid JSON: nested too deeply"
    if not isinstance(schema, dict):
        return f"A schema must be a JSON object {{…}}, not {_json_kind(schema)}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for name in kinds:
        if name not in _SCHEMA_TYPES:
            return f"Unknown type {json.dumps(name)}: use one of {', '.join(_SCHEMA_TYPES)}"
    return _compiler_problem(schema)


def _compiler_problem(schema: dict) -> str | None:
    """The engine's own check: llguidance builds the grammar (no tokenizer is needed to validate it)."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        problem = llguidance.LLMatcher.validate_grammar(grammar, None)
    except (ValueError, RuntimeError, TypeError) as exc:
        problem = str(exc)
    return f"The engine can't use this schema: {problem.splitlines()[0]}" if problem else None


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


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
    overflow: str = OVERFLOW_STOP
    output: str = OUTPUT_TEXT
    #: the last valid schema the user typed (kept while the output is something else, so switching back restores it)
    json_schema: str = ""
    show_tokens: bool = False  # ask for each token's probability and its top alternatives

    def __post_init__(self) -> None:
        if self.overflow not in OVERFLOW_POLICIES:  # a newer studio's policy, or a hand-edited file
            object.__setattr__(self, "overflow", OVERFLOW_STOP)
        if not isinstance(self.output, str) or self.output not in OUTPUT_KINDS:
            object.__setattr__(self, "output", OUTPUT_TEXT)
        if not isinstance(self.json_schema, str) or schema_problem(self.json_schema):
            object.__setattr__(self, "json_schema", "")  # a hand-edited file: never send a bad schema
        object.__setattr__(self, "show_tokens", bool(self.show_tokens))
        for name in ("presence_penalty", "frequency_penalty"):  # a hand-edited file: a number in [-2, 2], or off
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            object.__setattr__(self, name, min(PENALTY_LIMIT, max(-PENALTY_LIMIT, float(value))) if ok else 0.0)

    def structured(self) -> StructuredOutput | None:
        """The constraint replies are written under; a schema output with no valid schema yet writes free text."""
        if self.output == OUTPUT_JSON:
            return StructuredOutput("json_object")
        if self.output == OUTPUT_SCHEMA and self.json_schema:
            return StructuredOutput("json_schema", json.dumps(json.loads(self.json_schema)))
        return None

    def to_params(self) -> SamplingParams:
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
