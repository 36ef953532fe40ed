"""The lean Llama-family forward: same logits as transformers, chosen only where it fits."""

from __future__ import annotations

import pytest
import torch

from engine.load.options import LoadOptions
from engine.model import fast_forward
from engine.model.reference import transformers_mode


@pytest.fixture
def fresh_tiny(tiny_model_dir):
    from engine.load.loader import load_model

    return load_model(str(tiny_model_dir), LoadOptions(dtype="float32")).model


@pytest.mark.parametrize("pack", [False, True])
def test_lean_forward_agrees_with_transformers(fresh_tiny, pack: bool) -> None:
    model = fresh_tiny
    ids = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    fast = fast_forward.FastForward(model, pack=pack)
    check = fast_forward.check_against_transformers(model, fast)
    assert check.passed and check.max_rel_error < 1e-4
    with torch.inference_mode(), transformers_mode(model):
        # unpacked fusion re-points the model's own weights at slices of the fused ones: nothing changes
        assert torch.allclose(model(input_ids=ids).logits, before, atol=1e-6)


def test_fused_weights_are_shared_not_copied(fresh_tiny) -> None:
    model = fresh_tiny
    fast = fast_forward.FastForward(model, pack=False)
    attention = model.model.layers[0].self_attn
    fused = fast.linears["float32"].layers[0][0].weight  # layer 0's qkv
    assert attention.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attention.k_proj.weight.data_ptr() == fused[attention.q_proj.out_features :].data_ptr()


def test_built_once_per_model_and_used_by_the_engine(make_engine) -> None:
    engine = make_engine()
    assert engine.runner.fast is not None and "lean Llama-family forward" in engine.kernels
    assert fast_forward.build(engine.model) is engine.runner.fast
    assert make_engine(optimize=False).runner.fast is None


def test_other_architectures_keep_the_transformers_forward() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16,
    )  # fmt: skip
    assert "qwen3" in fast_forward.unsupported_reason(Qwen3ForCausalLM(config))


def test_the_check_covers_decode_over_cached_pages(fresh_tiny, monkeypatch) -> None:
    """A fault only in decode attention (a prefill-only check would miss it) turns the lean forward off."""
    from engine.model import attention

    real = attention._decode_attention
    monkeypatch.setattr(attention, "_decode_attention", lambda *args: real(*args) * 0.5)
    assert fast_forward.build(fresh_tiny) is None
    rejected = fast_forward.rejected_check(fresh_tiny)
    assert rejected is not None and not rejected.passed and rejected.max_rel_error > rejected.tolerance
    assert "decode 2 over cached pages" in rejected.stages and "seed 0" in rejected.stages
