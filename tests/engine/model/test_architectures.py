"""The engine beyond Llama: tiny random Qwen2, Qwen3, Mistral (with a sliding window) and Gemma models give
transformers' own greedy tokens; a model without the attention interface gets a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.errors import UnsupportedOptionError
from engine.load.loader import load_model
from engine.load.options import LoadOptions
from engine.types import SamplingParams
from tests.helpers import make_tiny_tokenizer, reference_greedy, run_to_completion

COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def save_tiny(folder: Path, config_class, model_class, **extra) -> Path:
    tokenizer = make_tiny_tokenizer(folder)
    config = config_class(
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**COMMON, **extra},
    )
    torch.manual_seed(1)
    model = model_class(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # decisive greedy choices
    model.save_pretrained(folder)
    return folder


def architectures():
    from transformers import (
        GemmaConfig,
        GemmaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    return {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 2}),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"num_key_value_heads": 2, "head_dim": 16}),
        "mistral-sliding": (MistralConfig, MistralForCausalLM, {"num_key_value_heads": 2, "sliding_window": 8}),
        "gemma": (GemmaConfig, GemmaForCausalLM, {"num_key_value_heads": 1, "head_dim": 16}),
    }


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "mistral-sliding", "gemma"])
def test_greedy_tokens_match_transformers(tmp_path: Path, name: str) -> None:
    config_class, model_class, extra = architectures()[name]
    folder = save_tiny(tmp_path / name, config_class, model_class, **extra)
    loaded = load_model(str(folder), LoadOptions(dtype="float32"))
    engine = Engine(loaded, EngineConfig(kv_pages=32, page_size=4))
    prompts = [[5, 9, 13, 40, 41, 42, 77, 100, 101, 102, 103, 7, 8, 200, 201], [6, 7], [50 + i for i in range(23)]]
    requests = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
    run_to_completion(engine)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == reference_greedy(loaded.model, prompt, 12, eos=False), name


def test_a_model_without_the_attention_interface_is_refused_by_name(tmp_path: Path) -> None:
    from transformers import BloomConfig, BloomForCausalLM

    tokenizer = make_tiny_tokenizer(tmp_path)
    BloomForCausalLM(BloomConfig(vocab_size=len(tokenizer), hidden_size=32, n_layer=1, n_head=2)).save_pretrained(
        tmp_path
    )
    loaded = load_model(str(tmp_path), LoadOptions(dtype="float32"))
    with pytest.raises(UnsupportedOptionError, match="BloomForCausalLM does not dispatch attention"):
        Engine(loaded, EngineConfig(kv_pages=8))
