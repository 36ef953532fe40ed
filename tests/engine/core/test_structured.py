"""Grammar-constrained output, logprobs and logit bias in the engine (the OpenAI API's features, below the API)."""

from __future__ import annotations

import json

import pytest

from engine.errors import InvalidRequestError
from engine.types import FinishReason, SamplingParams, StructuredOutput
from tests.helpers import run_to_completion

CHOICES = ["red", "green", "blue"]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,  # else a random model invents keys until max_tokens
}


def decoded(engine, request) -> str:
    return engine.tokenizer.decode(request.output_ids, skip_special_tokens=True)


def test_a_choice_and_a_schema_constrain_what_the_model_writes(make_engine) -> None:
    engine = make_engine()
    choice = engine.add_request(
        [5, 6, 7], SamplingParams(max_tokens=20, structured=StructuredOutput("choice", json.dumps(CHOICES)))
    )
    schema = engine.add_request(
        [8, 9], SamplingParams(max_tokens=40, structured=StructuredOutput("json_schema", json.dumps(SCHEMA)))
    )
    free = engine.add_request([8, 9], SamplingParams(max_tokens=6, min_tokens=6))
    run_to_completion(engine)
    assert choice.finish_reason is FinishReason.STOP and decoded(engine, choice) in CHOICES
    assert schema.finish_reason is FinishReason.STOP
    value = json.loads(decoded(engine, schema))
    assert isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)
    assert len(free.output_ids) == 6  # a free request in the same batch is unaffected


def test_constrained_requests_survive_preemption_and_get_no_drafts(make_engine) -> None:
    engine = make_engine(kv_pages=10, page_size=4, max_running=4)
    looped = [7, 8, 9, 10] * 4  # drafts would be found for an unconstrained request
    spec = StructuredOutput("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 6}))
    requests = [engine.add_request(looped, SamplingParams(max_tokens=24, structured=spec)) for _ in range(3)]
    run_to_completion(engine)
    totals = engine.metrics.snapshot().totals
    assert totals.preemptions > 0 and totals.draft_tokens == 0
    for request in requests:
        if request.finish_reason is FinishReason.STOP:
            assert isinstance(json.loads(decoded(engine, request)), list)
    engine.pool.check_invariants()


def test_a_bad_schema_is_refused_before_it_runs(make_engine) -> None:
    engine = make_engine()
    with pytest.raises(InvalidRequestError, match="json_schema"):
        engine.check_request([5], SamplingParams(structured=StructuredOutput("json_schema", '{"type": "nope"}')))
    with pytest.raises(InvalidRequestError, match="unknown structured output"):
        StructuredOutput("yaml")


def test_raw_logprobs_are_the_models_and_sorted(make_engine, tiny_loaded) -> None:
    import torch

    engine = make_engine()
    request = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, min_tokens=3, logprobs=5))
    events = run_to_completion(engine)[request.request_id]
    per_token = [lp for e in events for lp in (e.logprobs or [])]
    assert [lp.token_id for lp in per_token] == request.output_ids
    for lp in per_token:
        values = [alternative.logprob for alternative in lp.top]
        assert values == sorted(values, reverse=True) and len(values) == 5
        assert lp.top[0].token_id == lp.token_id and lp.top[0].text == lp.text  # greedy: the likeliest token
    with torch.inference_mode():
        from engine.model.reference import transformers_mode

        with transformers_mode(tiny_loaded.model):
            logits = tiny_loaded.model(input_ids=torch.tensor([[5, 6, 7]])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), dim=-1)[request.output_ids[0]]
    assert abs(per_token[0].logprob - float(expected)) < 1e-3


LOOPED = [7, 8, 9, 10, 11] * 6  # a prompt that repeats itself: prompt-lookup drafts are found and accepted


def _logprob_rows(events) -> list[tuple[int, float, list[int]]]:
    return [(lp.token_id, lp.logprob, [a.token_id for a in lp.top]) for e in events for lp in (e.logprobs or [])]


def _assert_same_logprobs(got, want) -> None:
    assert [(token, top) for token, _, top in got] == [(token, top) for token, _, top in want]
    assert all(abs(a - b) < 1e-4 for (_, a, _), (_, b, _) in zip(got, want, strict=True))


def test_logprobs_beside_a_speculating_request_are_the_requests_own(make_engine) -> None:
    """A step holding a verified draft has 1 + len(draft) logit rows for that request: a logprobs request sampled
    after it in the same step reads its own row, not one of the draft's."""
    ask = SamplingParams(max_tokens=6, min_tokens=6, logprobs=3)
    alone = make_engine(speculative=False)
    request = alone.add_request([5, 6, 7], ask)
    want = _logprob_rows(run_to_completion(alone)[request.request_id])
    engine = make_engine()
    drafting = engine.add_request(LOOPED, SamplingParams(max_tokens=30, min_tokens=30))
    drafter = engine.scheduler.drafter
    propose = drafter.propose
    # a draft in every step of the other request (three of its own tokens: most are rejected, which does not matter)
    drafter.propose = lambda rid, tokens: tokens[-3:] if rid == drafting.request_id else propose(rid, tokens)
    engine.step()  # its prompt; from the next step on it decodes with drafts
    asking = engine.add_request([5, 6, 7], ask)
    got = _logprob_rows(run_to_completion(engine)[asking.request_id])
    admitted = next(s for s in engine.metrics.snapshot().steps if asking.request_id in s.admitted)
    assert admitted.draft_tokens > 0  # the first logprob was read in a step that verified a draft
    assert len(got) == 6
    _assert_same_logprobs(got, want)


def test_a_logprobs_request_speculates_and_reports_every_token_it_accepts(make_engine) -> None:
    ask = SamplingParams(max_tokens=20, min_tokens=20, logprobs=2)
    runs = {}
    for speculative in (False, True):
        engine = make_engine(speculative=speculative)
        request = engine.add_request(LOOPED, ask)
        runs[speculative] = _logprob_rows(run_to_completion(engine)[request.request_id]), request.output_ids
        assert (engine.metrics.snapshot().totals.accepted_tokens > 0) is speculative
    assert runs[True][1] == runs[False][1] and [t for t, _, _ in runs[True][0]] == runs[True][1]
    _assert_same_logprobs(runs[True][0], runs[False][0])


def test_logit_bias_moves_the_choice(make_engine) -> None:
    engine = make_engine()
    plain = engine.add_request([5, 6, 7], SamplingParams(max_tokens=1))
    run_to_completion(engine)
    favourite = (plain.output_ids[0] + 17) % 300
    biased = engine.add_request([5, 6, 7], SamplingParams(max_tokens=1, logit_bias=((favourite, 100.0),)))
    banned = engine.add_request([5, 6, 7], SamplingParams(max_tokens=1, logit_bias=((plain.output_ids[0], -100.0),)))
    run_to_completion(engine)
    assert biased.output_ids == [favourite] and banned.output_ids != plain.output_ids


def test_free_requests_are_unchanged_token_for_token_beside_constrained_biased_and_logprob_ones(make_engine) -> None:
    """The batch with grammar, bias and logprob requests, then the same batch with free requests in their places
    (same prompts, same lengths, so every step has the same shape): the free requests write the same tokens."""
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
    special = [
        SamplingParams(max_tokens=30, structured=StructuredOutput("json_schema", json.dumps(SCHEMA))),
        SamplingParams(max_tokens=12, logit_bias=((20, 50.0), (21, -100.0))),
        SamplingParams(max_tokens=12, logprobs=5, temperature=0.9, seed=4),
    ]
    free = SamplingParams(max_tokens=16, ignore_eos=True)

    def run(others: list[SamplingParams]) -> tuple[list[list[int]], list[int]]:
        engine = make_engine(prefix_caching=False, speculative=False)
        requests = [engine.add_request(p, s) for p, s in zip(prompts, [free, *others], strict=True)]
        run_to_completion(engine)
        return [r.output_ids for r in requests], [len(r.output_ids) for r in requests[1:]]

    mixed, lengths = run(special)
    same_shapes = [SamplingParams(max_tokens=n, min_tokens=n) for n in lengths]
    reference, reference_lengths = run(same_shapes)
    assert reference_lengths == lengths and mixed[0] == reference[0]
    assert mixed[2][0] == 20  # the bias did act
