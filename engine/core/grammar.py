"""Structured output with llguidance (the grammar engine vLLM uses): JSON schemas, any JSON object, regexes, choices
and Lark/GBNF grammars compiled into a matcher per request, which gives the tokens allowed next as a bitmask."""

from __future__ import annotations

import functools
import json
import logging
import threading

import llguidance as llg
import numpy as np
import torch

from engine.core.schemas import decoding_schema, lark_with_schemas
from engine.errors import InvalidRequestError
from engine.types import StructuredOutput

log = logging.getLogger(__name__)

# compact JSON: the model writes `{"a": 1, "b": 2}`, not pretty-printed (fewer tokens, and small models otherwise
# spend a reply on whitespace)
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 256  # compiled grammars kept, by their spec


def _grammar(structured: StructuredOutput, close_objects: bool) -> str:
    kind, spec = structured.kind, structured.spec
    if kind == "json_object":  # any object: open by definition
        return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_DEFAULTS)
    if kind == "json_schema":
        schema = decoding_schema(json.loads(spec), close_objects)
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        return llg.grammar_from("choice", spec)
    # Lark (its inline `%json` schemas decoded as above: forced tool calls are one), or GBNF (converted)
    return llg.grammar_from("grammar", lark_with_schemas(spec, lambda schema: decoding_schema(schema, close_objects)))


class Matcher:
    """One request's place in its grammar. Engine thread only."""

    def __init__(self, matcher: llg.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._allowed: torch.Tensor | None = None  # this position's mask (the LM head and the sampler both read it)

    def allowed(self) -> torch.Tensor:
        """A bool mask over the vocabulary of the tokens the grammar allows next (EOS where it may end)."""
        if self._allowed is None:
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            mask = np.unpackbits(bits, bitorder="little")[: self._vocab_size].astype(bool)
            self._allowed = torch.from_numpy(mask)
        return self._allowed

    def consume(self, token: int) -> None:
        self._allowed = None
        if not self._matcher.consume_token(token):
            # the mask allowed it, so this is a grammar engine bug or a token the mask could not see: say so
            raise RuntimeError(f"the grammar refused token {token}: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """Nothing more can follow: the reply is complete (no need to sample an end token)."""
        return self._matcher.is_stopped()


class Grammars:
    """Compiles grammars against a model's tokenizer, caching a prototype matcher per spec (a copy is cheap)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: set[int], close_objects: bool = True) -> None:
        """close_objects: JSON schemas' objects are closed unless they say additionalProperties (core/schemas.py)."""
        self._hf_tokenizer = tokenizer
        self._close_objects = close_objects
        self._vocab_size = vocab_size
        self._eos = sorted(eos_ids)[:1] or [0]
        self._prototype = functools.lru_cache(maxsize=CACHE_SIZE)(self._compile)
        # one compile at a time: sixteen requests with the same new schema (an agent's fan-out, the benchmark) wait
        # for the first one's compile and then find it cached, instead of compiling it sixteen times at once
        self._lock = threading.Lock()

    @functools.cached_property
    def _tokenizer(self) -> llg.LLTokenizer:
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size, eos_token=self._eos[0])

    def _compile(self, structured: StructuredOutput) -> llg.LLMatcher:
        try:
            grammar = _grammar(structured, self._close_objects)
        except (ValueError, RuntimeError, json.JSONDecodeError) as exc:
            raise InvalidRequestError(f"invalid {structured.kind}: {exc}", param="structured") from None
        problem = llg.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if problem:
            raise InvalidRequestError(f"invalid {structured.kind}: {problem.splitlines()[0]}", param="structured")
        limits = llg.LLParserLimits(verbose_errors=False)  # errors must not echo a whole schema into logs
        matcher = llg.LLMatcher(self._tokenizer, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {structured.kind}: {matcher.get_error()}", param="structured")
        return matcher

    def warm(self) -> None:
        """Build the grammar engine's tokenizer now (it is otherwise built by the first structured request)."""
        with self._lock:
            self._tokenizer  # noqa: B018 (a cached property: reading it builds it)

    def matcher(self, structured: StructuredOutput) -> Matcher:
        """A fresh matcher for one request; a grammar that cannot compile raises InvalidRequestError."""
        with self._lock:
            prototype = self._prototype(structured)
        return Matcher(prototype.deep_copy(), self._vocab_size)
