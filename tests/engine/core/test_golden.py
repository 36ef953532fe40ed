"""Golden tests on the embedded model: the engine's greedy output equals transformers' own greedy generate
token for token, with many requests at once, under preemption, with prefix caching on and off."""

from __future__ import annotations

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.types import SamplingParams
from tests.helpers import reference_greedy, run_to_completion

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
LONG_STORY = " ".join(
    f"Chapter {i}: the traveller reached the {word} village, traded {i * 3} apples for a lantern, and wrote "
    f"a note about the {word} river before walking on."
    for i, word in enumerate(["northern", "quiet", "windy", "golden", "misty", "stone", "river", "hill"] * 2, 1)
)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea and the wind over the harbour at night.",
    "Explain gravity to a child in two sentences, using an apple, a ball and the moon as examples.",
    "List three red fruits.",
    "Translate 'good morning, how did you sleep?' into Spanish, French and German, one per line.",
    "Who wrote Romeo and Juliet, and in roughly which year was it first performed in London?",
    f"Summarise this diary in one sentence:\n{LONG_STORY}",
    "Give me a Python function that adds two numbers.",
]
SYSTEM = (
    "You are a meticulous assistant for a travel company. Always answer in a friendly tone, cite the city "
    "names you mention, never invent prices, and keep answers short. " * 8
)


@pytest.fixture(scope="module")
def prompt_ids(embedded_model) -> list[list[int]]:
    from engine.core.prompts import encode_prompt

    ids = [encode_prompt(embedded_model.tokenizer, prompt=q) for q in QUESTIONS]
    assert any(len(i) > 500 for i in ids) and len({len(i) for i in ids}) == len(ids)
    return ids


@pytest.fixture(scope="module")
def references(embedded_model, prompt_ids) -> list[list[int]]:
    return [reference_greedy(embedded_model.model, ids, MAX_TOKENS) for ids in prompt_ids]


def run_all(loaded, batch: list[list[int]], **config):
    engine = Engine(loaded, EngineConfig(**config))
    requests = [engine.add_request(ids, SamplingParams(max_tokens=MAX_TOKENS)) for ids in batch]
    run_to_completion(engine)
    engine.pool.check_invariants()
    assert engine.pool.num_used == 0
    return engine, requests


def test_eight_prompts_together_match_transformers(embedded_model, prompt_ids, references) -> None:
    _, requests = run_all(embedded_model, prompt_ids)
    assert [r.output_ids for r in requests] == references


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_match_under_preemption(embedded_model, prompt_ids, references, prefix_caching: bool) -> None:
    # 60 pages of 16 tokens: less than the 8 prompts plus their replies need at once; a 512-token step budget
    # without a prefill time budget admits them quickly enough that their replies outgrow the pool (a smaller or
    # time-limited one staggers them)
    _, requests = run_all(
        embedded_model, prompt_ids, kv_pages=60, prefix_caching=prefix_caching, max_step_tokens=512,
        prefill_budget_s=None,
    )  # fmt: skip
    assert sum(r.preemptions for r in requests) > 0
    assert [r.output_ids for r in requests] == references


def test_shared_system_prompt_is_cached_and_output_unchanged(embedded_model) -> None:
    from engine.core.prompts import encode_prompt

    tokenizer = embedded_model.tokenizer
    batch = [
        encode_prompt(tokenizer, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        for q in QUESTIONS[:4]
    ]
    shared = next(i for i, column in enumerate(zip(*batch, strict=False)) if len(set(column)) > 1)
    assert shared > 250
    engine = Engine(embedded_model, EngineConfig())
    first = engine.add_request(batch[0], SamplingParams(max_tokens=MAX_TOKENS))
    while first.num_computed < len(batch[0]):
        engine.step()  # the first request's prefill (in chunks of the step budget) publishes the system prompt's pages
    later = [engine.add_request(ids, SamplingParams(max_tokens=MAX_TOKENS)) for ids in batch[1:]]
    run_to_completion(engine)
    assert [r.cached_prompt_tokens for r in later] == [shared // 16 * 16] * 3
    totals = engine.metrics.snapshot().totals
    assert totals.prefix_hit_tokens == 3 * (shared // 16 * 16)
    for request, ids in zip([first, *later], batch, strict=True):
        assert request.output_ids == reference_greedy(embedded_model.model, ids, MAX_TOKENS)


EDIT = (
    "Fix the spelling mistakes in this paragraph and return the corrected paragraph only:\n"
    "The quick brown fox jumpd over the lazy dog. Every mornning the fox ran thru the forrest, looking for "
    "berrys and mushrooms, while the dog slept under the old oak tree near the river bank."
)


def test_speculative_decoding_is_token_exact(embedded_model) -> None:
    """Prompt-lookup drafts (the reply repeats the prompt) verified in one pass: the same greedy tokens as
    transformers, with drafts accepted and the accounting to show it."""
    from engine.core.prompts import encode_prompt

    ids = encode_prompt(embedded_model.tokenizer, prompt=EDIT)
    plain = Engine(embedded_model, EngineConfig(speculative=False))
    spec = Engine(embedded_model, EngineConfig())
    outputs = []
    for engine in (plain, spec):
        request = engine.add_request(ids, SamplingParams(max_tokens=48))
        run_to_completion(engine)
        outputs.append(request.output_ids)
    assert outputs[0] == outputs[1] == reference_greedy(embedded_model.model, ids, 48)
    totals = spec.metrics.snapshot().totals
    assert totals.draft_tokens > 0 and totals.accepted_tokens > 10
    steps = spec.metrics.snapshot().steps
    assert len(steps) < len(plain.metrics.snapshot().steps)  # fewer steps for the same tokens
    spec.pool.check_invariants()
    assert spec.pool.num_used == 0


def reference_penalized_greedy(model, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> list[int]:
    """A plain reference for OpenAI's penalties: transformers' greedy generate (with its own repetition penalty) and a
    logits processor that subtracts, per token of the reply so far, frequency x count + presence x (count > 0)."""
    from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    from engine.model.llama_family import transformers_model
    from engine.model.reference import transformers_mode

    class OpenAIPenalties(LogitsProcessor):
        def __call__(self, input_ids, scores):
            counts: dict[int, int] = {}
            for token in input_ids[0, len(prompt_ids) :].tolist():
                counts[token] = counts.get(token, 0) + 1
            for token, count in counts.items():
                scores[0, token] -= params.frequency_penalty * count + params.presence_penalty
            return scores

    processors = [OpenAIPenalties()]
    if params.repetition_penalty != 1.0:  # vLLM's order: the repetition penalty first
        processors.insert(0, RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    model = transformers_model(model)  # the embedded file is built from the engine's modules: transformers' around them
    with transformers_mode(model):
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                pad_token_id=model.config.pad_token_id or 0, logits_processor=LogitsProcessorList(processors),
            )  # fmt: skip
    return out[0, len(prompt_ids) :].tolist()


PENALTY_TOKENS = 16
PENALTIES = [
    SamplingParams(max_tokens=PENALTY_TOKENS, presence_penalty=0.8, frequency_penalty=0.8),
    SamplingParams(max_tokens=PENALTY_TOKENS, presence_penalty=-2.0),  # negative: repeats favoured
    SamplingParams(max_tokens=PENALTY_TOKENS, frequency_penalty=2.0, repetition_penalty=1.2),
]


def test_greedy_with_presence_and_frequency_penalties_matches_a_plain_reference(embedded_model, prompt_ids) -> None:
    """Three penalised requests batched with a free one on the same prompt, in float32: each equals the reference
    token for token, and the penalties change the replies (so the check can fail)."""
    prompt = prompt_ids[1]  # the haiku: each of these penalties changes its greedy reply within 16 tokens
    engine = Engine(embedded_model, EngineConfig())
    free = engine.add_request(prompt, SamplingParams(max_tokens=PENALTY_TOKENS))
    requests = [engine.add_request(prompt, params) for params in PENALTIES]
    run_to_completion(engine)
    plain = reference_greedy(embedded_model.model, prompt, PENALTY_TOKENS)
    assert free.output_ids == plain
    for params, request in zip(PENALTIES, requests, strict=True):
        expected = reference_penalized_greedy(embedded_model.model, prompt, PENALTY_TOKENS, params)
        assert request.output_ids == expected, params
        assert expected != plain, params
