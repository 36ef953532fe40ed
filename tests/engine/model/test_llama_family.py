"""The engine's own Llama-family modules: the same computation as transformers' classes (dense forward, rotary
types, biases, sliding windows), transformers' classes built around the same weights where its forward is needed,
and a file held as stored that loads and streams without transformers' modeling code ever imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from engine.model import llama_family
from tests.gguf_files import write_tiny_model
from tests.helpers import make_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[3]

SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
CONFIGS = {
    "llama": ("LlamaConfig", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "llama, llama3 rope": (
        "LlamaConfig",
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "qwen2, a sliding layer, yarn rope": (
        "Qwen2Config",
        dict(
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,
            layer_types=None,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "mistral, a window": ("MistralConfig", dict(sliding_window=6, head_dim=16)),
}


def _transformers_pair(name: str):
    """A randomly initialised transformers model and ours holding its very tensors."""
    import transformers
    from transformers import AutoModelForCausalLM

    class_name, extra = CONFIGS[name]
    config = getattr(transformers, class_name)(**SIZES, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    theirs = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    for module in theirs.modules():  # biases too: random, so a misplaced one shows
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.normal_(module.bias, std=0.5)
    ours = llama_family.LlamaFamilyForCausalLM(config)
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: transformers' state lists the embedding
    ours.tie_weights()
    return theirs, ours


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_dense_forward_is_transformers_forward(name: str) -> None:
    theirs, ours = _transformers_pair(name)
    assert llama_family.unsupported_reason(theirs.config) is None
    torch.testing.assert_close(ours.model.rotary_emb.inv_freq, theirs.model.rotary_emb.inv_freq)
    assert ours.model.rotary_emb.attention_scaling == theirs.model.rotary_emb.attention_scaling
    ids = torch.randint(0, SIZES["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = theirs(input_ids=ids).logits
    got = ours(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    if "sliding" in name or "window" in name:  # the window matters at 12 tokens: a causal-only mask would differ
        config = theirs.config
        window = config.sliding_window
        config.sliding_window = None
        if "layer_types" in config.to_dict():
            config.layer_types = ["full_attention"] * config.num_hidden_layers
        wide = llama_family.LlamaFamilyForCausalLM(config)
        wide.load_state_dict(ours.state_dict(), assign=True)
        assert not torch.allclose(wide(input_ids=ids).logits, expected, atol=1e-3)
        config.sliding_window = window


def test_transformers_classes_are_built_around_the_same_weights() -> None:
    theirs, ours = _transformers_pair("llama, llama3 rope")
    modules = len(list(ours.modules()))
    built = llama_family.transformers_model(ours)
    assert type(built).__name__ == "LlamaForCausalLM" and llama_family.transformers_model(ours) is built
    assert built.model.layers[1].self_attn.q_proj is ours.model.layers[1].self_attn.q_proj
    assert built.model.norm.weight is ours.model.norm.weight
    assert all(not p.is_meta for p in [*built.parameters(), *built.buffers()])
    assert len(list(ours.modules())) == modules  # not a submodule of ours: its weights are not counted twice
    ids = torch.tensor([[5, 9, 2, 77, 31]])
    with torch.inference_mode():
        torch.testing.assert_close(built(input_ids=ids).logits, ours(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    assert llama_family.transformers_model(theirs) is theirs


def test_what_the_lean_forward_cannot_run_stays_with_transformers() -> None:
    from transformers import LlamaConfig

    dynamic = LlamaConfig(**SIZES, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})
    assert "rope type 'dynamic'" in llama_family.unsupported_reason(dynamic)
    assert "architecture 'phi3'" in llama_family.unsupported_reason(type("C", (), {"model_type": "phi3"})())
    # the lean forward refuses output-projection biases: such a model runs transformers' forward, so is its class
    biased = LlamaConfig(**SIZES, attention_bias=True)
    assert llama_family.unsupported_reason(biased) == "biases on output projections"


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tiny_tokenizer(folder)
    kinds = lambda name: GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else GGMLQuantizationType.Q4_K  # noqa: E731
    return write_tiny_model(folder / "tiny-q4_k.gguf", folder, kinds, arch="qwen2", hidden=256, intermediate=512)


SCRIPT = """
import sys
from engine.load import weight_plan
weight_plan.SMALL_MODEL_FLOAT32_BYTES = 0  # hold even this tiny file as stored
from engine.load.loader import load_model
from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.types import SamplingParams
loaded = load_model(sys.argv[1])
engine = Engine(loaded, EngineConfig(kv_pages=32, page_size=4))
request = engine.add_request([3, 17, 250, 9], SamplingParams(max_tokens=6, ignore_eos=True))
while engine.has_unfinished:
    engine.step()
imported = [name for name in ("transformers.modeling_utils", "torch._dynamo") if name in sys.modules]
print(type(loaded.model).__name__, engine.runner.fast.check.describe(), len(request.output_ids), imported)
"""


def test_a_file_held_as_stored_runs_without_transformers_modeling_code(q4_file: Path) -> None:
    """The point of these classes: transformers' modeling import (and torch._dynamo's, which it and initialising meta
    tensors pull in) is seconds of every start, and nothing on this path needs it."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(q4_file)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("LlamaFamilyForCausalLM agrees with the dense reference forward on 2 of 2 layers")
    assert line.endswith(" 6 []")  # six tokens streamed; neither module imported


def test_without_the_lean_forward_the_engine_runs_transformers_classes_on_the_same_weights(
    q4_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine
    from engine.load import weight_plan
    from engine.load.loader import load_model
    from engine.types import SamplingParams
    from tests.helpers import run_to_completion

    monkeypatch.setattr(weight_plan, "SMALL_MODEL_FLOAT32_BYTES", 0)
    loaded = load_model(str(q4_file))
    assert isinstance(loaded.model, llama_family.LlamaFamilyForCausalLM)
    assert "Qwen2ForCausalLM" in loaded.info.description
    outputs = []
    for optimize in (True, False):
        engine = Engine(loaded, EngineConfig(kv_pages=32, page_size=4, optimize=optimize))
        assert (engine.runner.fast is not None) == optimize
        assert type(engine.runner.model).__name__ == ("LlamaFamilyForCausalLM" if optimize else "Qwen2ForCausalLM")
        request = engine.add_request([3, 17, 250, 9, 41], SamplingParams(max_tokens=6, ignore_eos=True))
        run_to_completion(engine)
        outputs.append(request.output_ids)
    assert outputs[0] == outputs[1]
