"""The KV cache's dtype and budget: float32 for the exact reference, a 16-bit model's own, bfloat16 for models held as
stored where the paged attention takes it (and then greedy replies keep to float32 KV's for their first tokens), an
automatic budget that grows with the model's KV and shrinks with the free memory."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.load import kv_policy

# bfloat16 keys and values round at 2^-9 of themselves; over a reply that moves the logits a little every token, and a
# near-tie among the leading tokens then goes the other way. 16 tokens: the length of a short answer, the first
# sentence a user reads; the embedded model's near-ties ("The" against "L'" before "capital of France", 0.08 logits
# apart in float32) sit in the first tokens, so this catches a KV path that is more than rounding
AGREE_TOKENS = 16


def test_the_reference_keeps_float32_kv_and_a_16_bit_model_its_own() -> None:
    assert kv_policy.kv_dtype("cpu", torch.float32, as_stored=False) == torch.float32
    assert kv_policy.kv_dtype("cpu", torch.bfloat16, as_stored=False) == torch.bfloat16
    assert kv_policy.kv_dtype("cuda", torch.float16, as_stored=False) == torch.float16


def test_a_model_held_as_stored_gets_bfloat16_kv_where_the_attention_takes_it(monkeypatch) -> None:
    monkeypatch.setattr(kv_policy, "attention_takes", lambda kv: True)
    assert kv_policy.kv_dtype("cpu", torch.float32, as_stored=True) == torch.bfloat16
    monkeypatch.setattr(kv_policy, "attention_takes", lambda kv: False)
    assert kv_policy.kv_dtype("cpu", torch.float32, as_stored=True) == torch.float32


def test_the_attention_probe_tells_float32_from_what_it_cannot_take() -> None:
    assert kv_policy.attention_takes(torch.float32)
    assert isinstance(kv_policy.attention_takes(torch.bfloat16), bool)  # either way, decided by running it


def test_the_automatic_budget_grows_with_the_model_and_shrinks_with_free_memory() -> None:
    small, large = 20_000, 80_000  # bytes of KV per token
    plenty = 64 * 1024**3
    assert kv_policy.default_budget(small, plenty) == kv_policy.DEFAULT_TOKENS * small
    assert kv_policy.default_budget(large, plenty) == kv_policy.DEFAULT_TOKENS * large
    tight = 1024**3  # half of it is less than 16,384 tokens of the large model
    assert kv_policy.default_budget(large, tight) == tight // 2
    assert kv_policy.default_budget(large, 1024) == kv_policy.minimum_budget(large)  # one long chat at least


@pytest.mark.slow
def test_bfloat16_kv_keeps_greedy_replies_to_float32_kvs_for_their_first_tokens(embedded_model) -> None:
    """The embedded model in float32 with bfloat16 KV against float32 KV, on a fixed prompt set."""
    if not kv_policy.attention_takes(torch.bfloat16):
        pytest.skip("the paged attention here takes only float32 pages for float32 queries")
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.core.prompts import encode_prompt
    from engine.types import SamplingParams
    from tests.engine.core.test_golden import QUESTIONS
    from tests.helpers import run_to_completion

    prompts = [encode_prompt(embedded_model.tokenizer, prompt=q) for q in QUESTIONS[:6]]
    replies = {}
    for kv in (torch.float32, torch.bfloat16):
        engine = Engine(dataclasses.replace(embedded_model, kv_dtype=kv), EngineConfig(kv_pages=256))
        assert engine.cache.storage.dtype == kv
        requests = [engine.add_request(ids, SamplingParams(max_tokens=AGREE_TOKENS)) for ids in prompts]
        run_to_completion(engine)
        replies[kv] = [r.output_ids for r in requests]
    assert replies[torch.bfloat16] == replies[torch.float32]
