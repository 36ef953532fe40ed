"""Torch-free request and event types: what callers, remote clients and widgets import."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from engine.errors import InvalidRequestError

_ids = itertools.count(1)
#: seeds a torch generator takes: 64 bits, signed or not
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
#: a temperature below this is greedy (vLLM's epsilon): dividing logits by 1e-40 overflows to inf, and softmax of inf
#: is NaN, which picked the last token of the vocabulary every time (through any grammar's mask)
GREEDY_BELOW = 1e-5
#: repetition penalties outside this range break the arithmetic (1e-300 turns every seen token's logit into inf)
#: or mean nothing a user could want; HF's own advice is 1.0-1.5
REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX = 0.01, 100.0


def new_request_id() -> str:
    return f"req-{next(_ids)}"


class FinishReason(StrEnum):
    """Why a request ended. A StrEnum, so it is also its own wire value ("stop", ...)."""

    STOP = "stop"  # EOS, stop token or stop string
    LENGTH = "length"  # max tokens or the model's context
    ABORT = "abort"  # cancelled by the client
    ERROR = "error"  # the step it was in failed

    @property
    def completed(self) -> bool:
        """The reply ended as the model or its limits decided (not cancelled, not failed)."""
        return self in (FinishReason.STOP, FinishReason.LENGTH)


class StructuredKind(StrEnum):
    """What constrains a structured output (a StrEnum: its own wire value, as vLLM's structured_outputs names it)."""

    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # JSON matching a schema
    REGEX = "regex"
    CHOICE = "choice"  # one of a list of strings
    GRAMMAR = "grammar"  # a Lark or GBNF grammar


STRUCTURED_KINDS = tuple(StructuredKind)
MAX_TOP_LOGPROBS = 20  # as OpenAI's API allows
PENALTY_LIMIT = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI's API allows


@dataclass(frozen=True)
class StructuredOutput:
    """Output constrained by a grammar: a JSON schema (as JSON text), any JSON object, a regex, a choice among
    strings (a JSON list), or a Lark/GBNF grammar. Hashable, so compiled grammars are cached by it."""

    kind: StructuredKind  # its value as a string is taken too
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidRequestError(f"unknown structured output {self.kind!r}; one of {', '.join(STRUCTURED_KINDS)}")
        object.__setattr__(self, "kind", StructuredKind(self.kind))


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    #: OpenAI's penalties over the reply's own tokens: a token's logit drops by presence_penalty once it has appeared,
    #: and by frequency_penalty times the times it appeared (negative values favour repeats); -2 to 2
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS and stop tokens cannot end the reply before it has this many tokens
    #: log probabilities of the chosen tokens (raw: the model's, before sampling settings), with this many top
    #: alternatives each; None: off
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # added to the token's logit before sampling
    structured: StructuredOutput | None = None  # grammar-constrained output

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalized(self) -> bool:
        """A penalty changes logits by the tokens before: the repetition penalty, or OpenAI's presence/frequency."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self) -> None:
        """Raise InvalidRequestError for a value no request may have. Checked once per instance: the edge that
        builds the params checks them, and the engine's own check of the same params (it cannot know who built
        them) returns at once."""
        if self.__dict__.get("_valid"):
            return

        def bad(message: str) -> None:
            raise InvalidRequestError(message)

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max tokens must be at least 1, not {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            bad(f"temperature must be 0 (greedy) or positive, not {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top-p must be in (0, 1], not {self.top_p}")
        if self.top_k < 0:
            bad(f"top-k must be 0 (off) or positive, not {self.top_k}")
        if not (0.0 <= self.min_p < 1.0):
            bad(f"min-p must be in [0, 1), not {self.min_p}")
        if not REPETITION_PENALTY_MIN <= self.repetition_penalty <= REPETITION_PENALTY_MAX:  # NaN fails too
            bad(
                f"repetition penalty must be from {REPETITION_PENALTY_MIN:g} to {REPETITION_PENALTY_MAX:g}, "
                f"not {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not math.isfinite(value) or not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                bad(f"{name.replace('_', ' ')} must be between -{PENALTY_LIMIT:g} and {PENALTY_LIMIT:g}, not {value}")
        if self.seed is not None and not (isinstance(self.seed, int) and SEED_MIN <= self.seed <= SEED_MAX):
            bad(f"the seed must be an integer from {SEED_MIN} to {SEED_MAX}, not {self.seed}")
        if any(not s for s in self.stop):
            bad("stop strings must not be empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            bad(f"top logprobs must be between 0 and {MAX_TOP_LOGPROBS}, not {self.logprobs}")
        if any(not math.isfinite(b) or abs(b) > 100 for _, b in self.logit_bias):
            bad("logit bias values must be between -100 and 100")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            bad(f"min tokens must be between 0 and max tokens ({self.max_tokens}), not {self.min_tokens}")
        object.__setattr__(self, "_valid", True)  # not a field: equality, hashing and replace() ignore it


@dataclass
class RequestStats:
    """Final figures of a request, stamped where it ran; intervals computed at the edge."""

    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    decode_tokens_per_s: float | None
    e2e_s: float
    queue_s: float | None
    preemptions: int
    finish_reason: FinishReason
    inter_token_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Alternative:
    """A token the model could have written at a position, and its log probability."""

    text: str
    logprob: float
    token_id: int = -1  # -1 where the token id is not known (a remote endpoint reports text)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely tokens at its position (best first)."""

    text: str
    logprob: float
    top: tuple[Alternative, ...] = ()
    token_id: int = -1


@dataclass
class TokenEvent:
    """What one step did for one request: new tokens and text, and the end when it came."""

    request_id: str
    tag: str
    token_ids: list[int]
    text: str
    time: float
    finished: bool = False
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked for them
    tool_calls: list[dict] | None = None  # OpenAI-shaped calls a remote endpoint reported, on the finishing event
    #: the request's own part at fault where an error is the request's (its grammar: "structured"), else None
    error_param: str | None = None

    @classmethod
    def ending(
        cls,
        request_id: str,
        reason: FinishReason,
        *,
        tag: str = "",
        error: str | None = None,
        stats: RequestStats | None = None,
        at: float | None = None,
    ) -> TokenEvent:
        """The finishing event of a request that ends without new tokens (failed, cancelled, or a remote's end)."""
        when = time.monotonic() if at is None else at
        return cls(request_id, tag, [], "", when, True, reason, stats, error)

    @classmethod
    def failed(cls, request_id: str, error: str, *, tag: str = "", at: float | None = None) -> TokenEvent:
        """The finishing event of a request that failed with error."""
        return cls.ending(request_id, FinishReason.ERROR, tag=tag, error=error, at=at)


#: where a request's events go when it is not iterated: called with one or more of its events at a time (the engine
#: thread hands each sink every event of one step in one call), in the runner's thread; it must return quickly
EventSink = Callable[[list[TokenEvent]], None]

ROLES = {"system", "user", "assistant", "tool", "developer"}


def validate_messages(messages: Sequence[dict]) -> list[dict]:
    """Chat messages checked and reduced to {role, content} with text content; an assistant's tool calls (content may
    then be empty) and a tool result's call id are kept."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {role, content} objects")
    clean = []
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidRequestError(f"message {number} needs a 'role' and a 'content'")
        role = message["role"]
        content = message.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequestError(f"message {number} has unknown role {role!r}")
        if isinstance(content, list):  # OpenAI content parts: text only (the models served here read no images)
            content = _text_of_parts(content, number)
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is not None and not (isinstance(calls, list) and all(_is_call(c) for c in calls)):
            raise InvalidRequestError(f"message {number}: 'tool_calls' must be a list of {{type, function}} objects")
        if content is None and calls:
            content = ""  # what clients send back after a tool call: no text, only the calls
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {number} has no text content")
        item: dict = {"role": role, "content": content}
        if calls:
            item["tool_calls"] = calls
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            item["tool_call_id"] = message["tool_call_id"]
        clean.append(item)
    return clean


def _is_call(call: object) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def _text_of_parts(parts: list, number: int) -> str | None:
    """The text of a message's content parts; a part of another kind (an image, audio, a file) is refused by name,
    as vLLM refuses it for a text-only model, rather than dropped without a word."""
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            named = f"of type {kind!r}" if isinstance(kind, str) else "without a type"
            raise InvalidRequestError(
                f"message {number}: content part {index} is {named}; this model reads text only (parts of type 'text')"
            )
        texts.append(part.get("text"))
    return "".join(texts) if all(isinstance(t, str) for t in texts) else None
