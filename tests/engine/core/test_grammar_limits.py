"""What a grammar may cost: llguidance's limits and a first-token check refuse blow-ups at compile time, the cache
keeps compiled grammars within a byte budget, a compile past its time limit is refused, and a grammar the engine
gives up on mid-reply ends only its own request, with an error naming the grammar."""

from __future__ import annotations

import json
import threading

import pytest

from engine.core.grammar import GrammarLimits, Grammars
from engine.core.grammar_cache import ByteBoundedCache
from engine.errors import InvalidRequestError
from engine.types import FinishReason, SamplingParams, StructuredOutput
from tests.helpers import run_to_completion


def grammars_for(engine, **limits) -> Grammars:
    return Grammars(engine.tokenizer, engine.vocab_size, engine.eos_ids, GrammarLimits(**limits))


def test_the_cache_is_bounded_by_bytes_and_drops_the_least_recently_used() -> None:
    cache: ByteBoundedCache[str] = ByteBoundedCache(100)
    assert cache.put("a", "A", 40) and cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recently used
    assert cache.put("c", "C", 40)  # 120 > 100: b goes
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"
    assert cache.nbytes == 80 and len(cache) == 2
    assert not cache.put("huge", "H", 101) and cache.get("huge") is None and cache.nbytes == 80
    cache.discard("a")
    assert cache.nbytes == 40


@pytest.mark.parametrize(
    ("kind", "spec", "words"),
    [
        ("regex", "(a{1001}){1000}", "limits"),  # the blow-up: ~170 MB of lexer on its first token
        (
            "json_schema",
            json.dumps({"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}),
            "limits",
        ),
        ("json_schema", json.dumps({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}), "limits"),
    ],
)
def test_grammars_that_blow_up_or_admit_nothing_are_refused_when_compiled(make_engine, kind, spec, words) -> None:
    engine = make_engine()
    grammars = grammars_for(engine)
    structured = StructuredOutput(kind, spec)
    with pytest.raises(InvalidRequestError, match=words) as refused:
        grammars.check(structured)
    assert refused.value.param == "structured"
    # the refusal is remembered: sent again, it is refused without compiling
    compiled = []
    grammars._compile = lambda s: compiled.append(s)  # would be called on a miss
    with pytest.raises(InvalidRequestError, match=words):
        grammars.check(structured)
    assert compiled == []


def test_compiled_grammars_stay_within_the_cache_budget(make_engine) -> None:
    engine = make_engine()
    grammars = grammars_for(engine, cache_bytes=64 * 1024)
    for n in range(40):
        grammars.check(StructuredOutput("choice", json.dumps([f"option {n} " + "x" * 3000, "other"])))
        assert grammars.cache.nbytes <= 64 * 1024
    assert 0 < len(grammars.cache) < 40  # some kept, the oldest let go


def test_a_compile_past_its_time_limit_is_refused_and_the_caller_is_released(make_engine, monkeypatch) -> None:
    import engine.core.grammar as grammar_module

    engine = make_engine()
    grammars = grammars_for(engine, compile_timeout_s=0.2)
    release = threading.Event()
    real = grammar_module._grammar

    def slow(*args):
        release.wait(30)
        return real(*args)

    monkeypatch.setattr(grammar_module, "_grammar", slow)
    with pytest.raises(InvalidRequestError, match="longer than 0.2 s") as refused:
        grammars.check(StructuredOutput("regex", "[a-z]+"))
    assert refused.value.param == "structured"
    release.set()


def test_a_grammar_given_up_mid_reply_ends_its_request_only(make_engine) -> None:
    """The grammar engine refuses a token mid-reply (its limits hit on a later token): the request ends with an error
    naming its grammar (param "structured"), without the refused token; a free request beside it finishes."""
    engine = make_engine()
    spec = StructuredOutput("regex", "[a-z ]{1,200}")
    constrained = engine.add_request([5, 6, 7], SamplingParams(max_tokens=40, structured=spec))
    free = engine.add_request([8, 9], SamplingParams(max_tokens=8, min_tokens=8))
    inner = constrained.matcher._matcher

    class GivesUpAfterThree:
        def __init__(self) -> None:
            self.taken = 0

        def consume_token(self, token: int) -> bool:
            self.taken += 1
            return inner.consume_token(token) if self.taken <= 3 else False

        def get_error(self) -> str:
            return "lexer error: too many expressions constructed" if self.taken > 3 else inner.get_error()

        def __getattr__(self, name):
            return getattr(inner, name)

    constrained.matcher._matcher = GivesUpAfterThree()
    events = run_to_completion(engine)
    final = events[constrained.request_id][-1]
    assert final.finish_reason is FinishReason.ERROR and final.error_param == "structured"
    assert "gave up" in final.error and "after 3 tokens" in final.error
    assert len(constrained.output_ids) == 3  # the refused token is not part of the reply
    assert free.finish_reason is FinishReason.LENGTH and len(free.output_ids) == 8
    assert engine.grammars.cache.get(spec) is None  # its shared lexer may be in error: compiled afresh next time


def test_a_compile_that_finishes_before_its_callback_is_added_does_not_deadlock(make_engine, monkeypatch) -> None:
    """A compile done by the time its done-callback is added runs the callback in the submitting thread; that callback
    takes the grammars' lock, which the submitting thread held then: a served request hung for good (seen when the
    grammar engine's tokenizer had been built ahead and a small grammar compiled at once)."""
    from concurrent.futures import Future

    engine = make_engine()
    grammars = grammars_for(engine)

    def compile_at_once(fn, *args):
        done: Future = Future()
        done.set_result(fn(*args))
        return done

    monkeypatch.setattr(grammars._compiler, "submit", compile_at_once)
    worker = threading.Thread(target=grammars.check, args=(StructuredOutput("regex", "[a-z]+"),), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert not grammars._pending  # and the compile is no longer pending
    grammars.check(StructuredOutput("regex", "[a-z]+"))  # cached now
