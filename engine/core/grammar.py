"""Structured output with llguidance (the grammar engine vLLM uses): JSON schemas, any JSON object, regexes, choices
and Lark/GBNF grammars compiled into a matcher per request, which gives the tokens allowed next as a bitmask."""

from __future__ import annotations

import functools
import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance as llg
import numpy as np
import torch

from engine.core.grammar_cache import ByteBoundedCache, resident_bytes
from engine.core.schemas import decoding_schema, lark_with_schemas
from engine.errors import InvalidRequestError
from engine.types import StructuredKind, StructuredOutput

log = logging.getLogger(__name__)

# compact JSON: the model writes `{"a": 1, "b": 2}`, not pretty-printed (fewer tokens, and small models otherwise
# spend a reply on whitespace)
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MIB = 1024 * 1024


def _grammar(structured: StructuredOutput, close_objects: bool) -> str:
    kind, spec = structured.kind, structured.spec
    if kind is StructuredKind.JSON_OBJECT:  # any object: open by definition
        return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_DEFAULTS)
    if kind is StructuredKind.JSON_SCHEMA:
        schema = decoding_schema(json.loads(spec), close_objects)
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
    if kind is StructuredKind.REGEX:
        return llg.LLMatcher.grammar_from_regex(spec)
    if kind is StructuredKind.CHOICE:
        return llg.grammar_from("choice", spec)
    # Lark (its inline `%json` schemas decoded as above: forced tool calls are one), or GBNF (converted)
    return llg.grammar_from("grammar", lark_with_schemas(spec, lambda schema: decoding_schema(schema, close_objects)))


JSON_KINDS = (StructuredKind.JSON_OBJECT, StructuredKind.JSON_SCHEMA)


@dataclass(frozen=True)
class GrammarLimits:
    """What one grammar may cost. llguidance's own limits bound its lexer (states, and the work it may do to build
    them) and parser; ours bound the compile's time and what compiled grammars keep. A grammar past them is refused
    with a 400 naming the request's field; the issue's (a{1001}){1000} spent 1,000,000 units of lexer work (about
    170 MB, 3 s) on its first token and kept them, with llguidance's defaults."""

    lexer_states: int = 20_000  # about 1-2 kB each (llguidance's default: 250,000)
    lexer_fuel: int = 200_000  # lexer work to build it and take its first token (default 1,000,000; ~200 B a unit)
    step_fuel: int = 200_000  # lexer work per token mask (llguidance's default)
    step_items: int = 50_000  # parser items per token mask (llguidance's default)
    grammar_size: int = 500_000  # symbols in the grammar's rules (llguidance's default; a few MB of schema)
    compile_timeout_s: float = 10.0
    cache_bytes: int = 128 * MIB  # compiled grammars kept, by what they hold (resident memory measured per compile)

    def parser_limits(self) -> llg.LLParserLimits:
        return llg.LLParserLimits(
            max_lexer_states=self.lexer_states,
            initial_lexer_fuel=self.lexer_fuel,
            step_lexer_fuel=self.step_fuel,
            step_max_items=self.step_items,
            max_grammar_size=self.grammar_size,
            verbose_errors=False,  # errors must not echo a whole schema into logs
        )


class GrammarFailedError(InvalidRequestError):
    """The grammar engine gave up on a request's grammar while it ran (its limits, or a grammar no text can end)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="structured")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"


def _bits(matcher: llg.LLMatcher, vocab_size: int) -> np.ndarray:
    bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[:vocab_size].astype(bool)


class Matcher:
    """One request's place in its grammar. Engine thread only. A grammar the engine gives up on mid-reply (its
    limits) allows only the end token from then on, and the next consume() raises GrammarFailedError: the request
    ends with that error, its step-mates go on."""

    def __init__(self, matcher: llg.LLMatcher, vocab_size: int, end_token: int, on_failure=None) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._end_token = end_token
        self._on_failure = on_failure  # called once when the grammar engine gives up (the cache forgets the grammar)
        self._allowed: torch.Tensor | None = None  # this position's mask (the LM head and the sampler both read it)
        self.error: str | None = None
        self.tokens = 0

    def allowed(self) -> torch.Tensor:
        """A bool mask over the vocabulary of the tokens the grammar allows next (EOS where it may end)."""
        if self._allowed is None:
            mask = _bits(self._matcher, self._vocab_size)
            if self._matcher.is_error():
                self._fail(self._matcher.get_error())
                mask = np.zeros(self._vocab_size, dtype=bool)
                mask[self._end_token] = True  # a row with nothing allowed would sample garbage
            self._allowed = torch.from_numpy(mask)
        return self._allowed

    def consume(self, token: int) -> None:
        self._allowed = None
        if self.error is None and not self._matcher.consume_token(token):
            self._fail(self._matcher.get_error() or f"token {token} is not allowed here")
        if self.error is not None:
            raise GrammarFailedError(
                f"the grammar engine gave up on this request's grammar after {self.tokens} tokens: {self.error}"
            )
        self.tokens += 1

    def _fail(self, error: str) -> None:
        if self.error is None:
            self.error = _first_line(error)
            if self._on_failure is not None:
                self._on_failure()

    @property
    def finished(self) -> bool:
        """Nothing more can follow: the reply is complete (no need to sample an end token)."""
        return self._matcher.is_stopped() and self.error is None


class Grammars:
    """Compiles grammars against a model's tokenizer (one at a time, in a thread of its own, within a time limit),
    checks each by taking its first token, and caches a prototype matcher per spec (a copy is cheap) within a
    byte budget. Refusals are cached too: a grammar sent again is refused at once, without compiling it again."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_ids: set[int],
        limits: GrammarLimits | None = None,
        close_objects: bool = True,
    ) -> None:
        """close_objects: JSON schemas' objects are closed unless they say additionalProperties (core/schemas.py)."""
        self._close_objects = close_objects
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_ids)[:1] or [0]
        self.limits = limits or GrammarLimits()
        #: spec -> prototype matcher, or the refusal's message
        self.cache: ByteBoundedCache[llg.LLMatcher | str] = ByteBoundedCache(self.limits.cache_bytes)
        # one compile at a time: sixteen requests with the same new schema (an agent's fan-out, the benchmark) wait
        # for the first one's compile and then find it cached, instead of compiling it sixteen times at once; and
        # each compile's resident growth is its own
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._pending: dict[StructuredOutput, Future] = {}
        self._lock = threading.Lock()

    @functools.cached_property
    def _tokenizer(self) -> llg.LLTokenizer:
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size, eos_token=self._eos[0])

    def warm(self) -> None:
        """Build the grammar engine's tokenizer now (it is otherwise built by the first structured request)."""
        self._compiler.submit(lambda: self._tokenizer).result()

    def matcher(self, structured: StructuredOutput) -> Matcher:
        """A fresh matcher for one request; a grammar that cannot compile, or is past the limits, raises
        InvalidRequestError (param "structured")."""
        prototype = self._prototype(structured)
        forget = functools.partial(self.cache.discard, structured)  # its shared lexer may now be in error
        return Matcher(prototype.deep_copy(), self._vocab_size, self._eos[0], on_failure=forget)

    def check(self, structured: StructuredOutput) -> None:
        """Compile (or find cached) and check the grammar; raises as matcher() does."""
        self._prototype(structured)

    def _prototype(self, structured: StructuredOutput) -> llg.LLMatcher:
        entry = self.cache.get(structured)
        if entry is None:
            submitted = False
            with self._lock:
                entry = self.cache.get(structured)
                future = self._pending.get(structured) if entry is None else None
                if entry is None and future is None:
                    future = self._compiler.submit(self._compile_and_keep, structured)
                    self._pending[structured] = future
                    submitted = True
            if submitted:  # outside the lock: a compile already done runs this callback here, and it takes the lock
                future.add_done_callback(lambda _f: self._forget_pending(structured))
            if future is not None:
                try:
                    entry = future.result(timeout=self.limits.compile_timeout_s)
                except TimeoutError:
                    future.cancel()  # still queued behind another compile: never start it
                    raise InvalidRequestError(
                        f"compiling the {structured.kind} grammar took longer than {self.limits.compile_timeout_s:g} s "
                        "(the grammar engine's limit); simplify it",
                        param="structured",
                    ) from None
        if isinstance(entry, str):
            raise InvalidRequestError(entry, param="structured")
        return entry

    def _forget_pending(self, structured: StructuredOutput) -> None:
        with self._lock:
            self._pending.pop(structured, None)

    def _compile_and_keep(self, structured: StructuredOutput) -> llg.LLMatcher | str:
        """In the compile thread: the prototype or the refusal, cached with the bytes it holds."""
        before = resident_bytes()
        spec_bytes = len(structured.spec.encode("utf-8", "surrogatepass"))
        try:
            prototype, grammar_bytes = self._compile(structured)
        except InvalidRequestError as exc:
            self.cache.put(structured, str(exc), spec_bytes + len(str(exc)))
            return str(exc)
        after = resident_bytes()
        # what the compile left resident (its lexer, warmed by the check), at least the grammar's own text; where
        # /proc is missing, a multiple of the text (lexers run to tens of times their grammar)
        measured = after - before if before is not None and after is not None else 32 * grammar_bytes
        nbytes = max(spec_bytes + grammar_bytes, measured)
        if not self.cache.put(structured, prototype, nbytes):
            log.info("a %s grammar holding %d MiB is used but not cached (the cache holds %d MiB)",
                     structured.kind, nbytes // MIB, self.cache.capacity // MIB)  # fmt: skip
        return prototype

    def _compile(self, structured: StructuredOutput) -> tuple[llg.LLMatcher, int]:
        kind = structured.kind
        try:
            grammar = _grammar(structured, self._close_objects)
        except (ValueError, RuntimeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise InvalidRequestError(f"invalid {kind}: {_first_line(str(exc))}", param="structured") from None
        limits = self.limits.parser_limits()
        problem = llg.LLMatcher.validate_grammar(grammar, self._tokenizer, limits=limits)
        if problem:
            raise InvalidRequestError(f"invalid {kind}: {_first_line(problem)}", param="structured")
        matcher = llg.LLMatcher(self._tokenizer, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {kind}: {_first_line(matcher.get_error())}", param="structured")
        self._take_first_token(structured, matcher)
        return matcher, len(grammar)

    def _take_first_token(self, structured: StructuredOutput, prototype: llg.LLMatcher) -> None:
        """Run a copy of the grammar for one token (the lowest one allowed), so that a grammar the engine gives up on
        at once is refused now rather than mid-reply, and its lexer is warm for the first request: the issue's
        blow-up regex and the self-required schema fail at their first token, a $ref loop at its first mask."""
        probe = prototype.deep_copy()
        allowed = _bits(probe, self._vocab_size)
        if not probe.is_error():
            allowed[self._eos] = False
            tokens = np.flatnonzero(allowed)
            if tokens.size == 0 and structured.kind in JSON_KINDS:
                raise InvalidRequestError(f"the {structured.kind} admits no JSON value", param="structured")
            if tokens.size and probe.consume_token(int(tokens[0])) and not probe.is_error():
                _bits(probe, self._vocab_size)
        if probe.is_error():
            raise InvalidRequestError(
                f"the {structured.kind} is past the grammar engine's limits or admits no value: "
                f"{_first_line(probe.get_error())}",
                param="structured",
            )
