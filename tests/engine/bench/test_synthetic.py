"""Synthetic models: a random-weight folder transformers and the engine load, and the same weights as a GGUF file."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from engine.bench.synthetic import SHAPES, gguf_bytes, mix_types, synthetic_gguf, synthetic_model, tensor_specs
from engine.bench.synthetic_gguf import gguf_name


@pytest.fixture(scope="module")
def tiny_synthetic(tmp_path_factory):
    return synthetic_model("qwen2-tiny", root=tmp_path_factory.mktemp("synthetic"))


def test_the_shapes_are_those_of_the_real_models() -> None:
    half = SHAPES["qwen2-0.5b"]
    assert (half.hidden, half.layers, half.heads, half.kv_heads, half.intermediate) == (896, 24, 14, 2, 4864)
    params = sum(int(np.prod(d)) for _, d in tensor_specs(SHAPES["qwen2-1.5b"]))
    assert 1.3e9 < params < 1.45e9
    three, seven = SHAPES["qwen2-3b"], SHAPES["qwen2-7b"]
    assert (three.hidden, three.layers, three.heads, three.kv_heads, three.intermediate) == (2048, 36, 16, 2, 11008)
    assert (seven.hidden, seven.layers, seven.heads, seven.kv_heads, seven.intermediate) == (3584, 28, 28, 4, 18944)
    assert three.tied and not seven.tied  # as the real Qwen2.5-3B and 7B
    assert 6.8e9 < sum(int(np.prod(d)) for _, d in tensor_specs(seven)) < 6.95e9
    # Q4_K_M sizes as llama.cpp's files of these shapes have them (about 4.9 bits a weight)
    assert 1.6e9 < gguf_bytes(three, "q4_k_m") < 1.9e9 and 3.9e9 < gguf_bytes(seven, "q4_k_m") < 4.4e9
    types = mix_types(seven, "q4_k_m")
    assert types["output.weight"].name == "Q6_K" and types["token_embd.weight"].name == "Q4_K"
    assert sum(t.name == "Q6_K" for name, t in types.items() if "attn_v" in name) == 14  # half of 28


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


@pytest.fixture(scope="module")
def tiny_q4_k_m():
    return synthetic_gguf("qwen2-tiny")  # under the user cache: written once, reused by later runs


def test_the_q4_k_m_file_holds_random_valid_blocks_in_llama_cpp_s_mix(tiny_q4_k_m) -> None:
    import gguf

    reader = gguf.GGUFReader(tiny_q4_k_m)
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 49152
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types == mix_types(SHAPES["qwen2-tiny"], "q4_k_m")
    assert types["token_embd.weight"] == gguf.GGMLQuantizationType.Q6_K  # tied: the output's type
    assert types["blk.1.ffn_down.weight"] == gguf.GGMLQuantizationType.Q6_K  # the last eighth of the layers
    assert types["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q4_K
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all(), t.name
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            assert abs(values.mean()) < 0.002 and 0.015 < values.std() < 0.025, t.name
    assert tiny_q4_k_m.stat().st_size - gguf_bytes(SHAPES["qwen2-tiny"], "q4_k_m") < 4 << 20  # + header, tokenizer
    assert not list(tiny_q4_k_m.parent.glob("*.partial"))


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (the bench extra) is not here")
@pytest.mark.parametrize("kind", ["folder+q4_1", "q4_k_m"])
def test_llama_cpp_serves_the_gguf_file(kind, request) -> None:
    import httpx

    from engine.bench.servers import llama_cpp_server

    path = (
        request.getfixturevalue("tiny_synthetic").gguf
        if kind == "folder+q4_1"
        else request.getfixturevalue("tiny_q4_k_m")
    )
    with llama_cpp_server(str(path), threads=1, slots=2, ctx=512) as server:
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": [1, 2, 3, 4], "max_tokens": 5, "temperature": 0, "ignore_eos": True},
            timeout=60,
        ).json()
    assert answer["usage"]["completion_tokens"] == 5
    assert '"kv_unified": true' in server.details
