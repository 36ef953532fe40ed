"""Engine kernels: fused projections, fused RMSNorm and prepacked linears give the model's own results,
and can be taken off again for baselines."""

from __future__ import annotations

import torch

from engine.load.options import LoadOptions
from engine.model import patches
from engine.model.reference import transformers_mode


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_optimized_model_computes_the_same_logits(tiny_model_dir) -> None:
    from engine.load.loader import load_model

    loaded = load_model(str(tiny_model_dir), LoadOptions(dtype="float32"))
    model = loaded.model
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    before = logits(model, ids)
    applied = patches.optimize(model)
    assert {"fused QKV", "fused gate/up MLP", "fused RMSNorm"} <= set(applied.kinds)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, patches.FusedQKV)
    assert isinstance(layer.mlp, patches.FusedGatedMLP)
    after = logits(model, ids)
    assert torch.allclose(before, after, rtol=1e-4, atol=1e-4)
    with patches.original_modules(model):
        assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
        assert torch.equal(logits(model, ids), before)
    assert isinstance(model.model.layers[0].self_attn.q_proj, patches.FusedQKV)
    assert patches.optimize(model) is applied  # built once per model


def test_projection_stand_ins_fall_back_when_called_out_of_order(tiny_model_dir) -> None:
    from engine.load.loader import load_model

    attention = load_model(str(tiny_model_dir), LoadOptions(dtype="float32")).model.model.layers[0].self_attn
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    fused = patches.FusedQKV(q, k, v, pack=False)
    x = torch.randn(2, q.in_features)
    y = torch.randn(2, q.in_features)
    with torch.inference_mode():
        fused(x)  # pending k/v belong to x
        assert torch.allclose(patches.TakeProjection(fused, 1)(y), k(y), atol=1e-5)  # not x: computed anew
        assert torch.allclose(patches.TakeProjection(fused, 2)(x), v(x), atol=1e-5)


def test_transformers_mode_restores_attention_and_modules(tiny_model_dir) -> None:
    from engine.load.loader import load_model
    from engine.model.runner import prepare_model

    model = load_model(str(tiny_model_dir), LoadOptions(dtype="float32")).model
    prepare_model(model)
    patches.optimize(model)  # the patch path, used for architectures without the lean forward
    assert model.config._attn_implementation == "studio_paged"
    with transformers_mode(model):
        assert model.config._attn_implementation == "sdpa"
        assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"
    assert model.config._attn_implementation == "studio_paged"
    assert isinstance(model.model.layers[0].mlp, patches.FusedGatedMLP)


def test_engine_without_kernels_gives_the_same_tokens(make_engine) -> None:
    from engine.types import SamplingParams
    from tests.helpers import run_to_completion

    outputs = []
    for optimize in (True, False):
        engine = make_engine(optimize=optimize)
        request = engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=10, ignore_eos=True))
        run_to_completion(engine)
        outputs.append(request.output_ids)
        assert bool(engine.kernels) == optimize
    assert outputs[0] == outputs[1]
