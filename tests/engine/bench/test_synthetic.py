"""Synthetic models: a random-weight folder transformers and the engine load, and the same weights as a GGUF file."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from engine.bench.synthetic import SHAPES, synthetic_model, tensor_specs
from engine.bench.synthetic_gguf import gguf_name


@pytest.fixture(scope="module")
def tiny_synthetic(tmp_path_factory):
    return synthetic_model("qwen2-tiny", root=tmp_path_factory.mktemp("synthetic"))


def test_the_shapes_are_those_of_the_real_models() -> None:
    half = SHAPES["qwen2-0.5b"]
    assert (half.hidden, half.layers, half.heads, half.kv_heads, half.intermediate) == (896, 24, 14, 2, 4864)
    params = sum(int(np.prod(d)) for _, d in tensor_specs(SHAPES["qwen2-1.5b"]))
    assert 1.3e9 < params < 1.45e9


def test_the_folder_loads_and_the_engine_matches_transformers(tiny_synthetic) -> None:
    from engine.core.engine import Engine
    from engine.load.loader import load_model
    from engine.model.reference import transformers_mode
    from engine.types import SamplingParams

    loaded = load_model(str(tiny_synthetic.folder))
    assert loaded.info.architecture == "Qwen2ForCausalLM" and loaded.info.parameters == tiny_synthetic.parameters
    prompt = loaded.tokenizer("The weather today is", return_tensors="pt").input_ids
    engine = Engine(loaded)
    request = engine.add_request(prompt[0].tolist(), SamplingParams(max_tokens=8, min_tokens=8))
    while engine.has_unfinished:
        engine.step()
    with torch.inference_mode(), transformers_mode(loaded.model):
        reference = loaded.model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8, do_sample=False
        )
    assert request.output_ids == reference[0, prompt.shape[1] :].tolist()


def test_the_gguf_file_holds_the_same_model(tiny_synthetic) -> None:
    import gguf

    reader = gguf.GGUFReader(tiny_synthetic.gguf)
    assert reader.fields["general.architecture"].contents() == "qwen2"
    assert reader.fields["qwen2.block_count"].contents() == 2
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 49152
    names = {t.name for t in reader.tensors}
    assert names == {gguf_name(name) for name, _ in tensor_specs(SHAPES["qwen2-tiny"])}
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    assert np.allclose(norm.data, 1.0)


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (the bench extra) is not here")
def test_llama_cpp_serves_the_gguf_file(tiny_synthetic) -> None:
    import httpx

    from engine.bench.servers import llama_cpp_server

    with llama_cpp_server(str(tiny_synthetic.gguf), threads=1, slots=2, ctx=512) as server:
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": [1, 2, 3, 4], "max_tokens": 5, "temperature": 0, "ignore_eos": True},
            timeout=60,
        ).json()
    assert answer["usage"]["completion_tokens"] == 5
    assert '"kv_unified": true' in server.details
