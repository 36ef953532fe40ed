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


def test_the_checks_verdict_does_not_depend_on_the_heads_timed_twin(fresh_tiny) -> None:
    """Float32 layers (the measured choice on some machines) beside a bfloat16 head twin (measured faster on some):
    the twin's logits outside the leaders carry bfloat16's rounding, which is not the layers' error. The CI machine
    that found both turned the lean forward off over it."""
    from engine.model import formats

    if not formats.bfloat16_usable(torch.device("cpu")):
        pytest.skip("no oneDNN bfloat16 here: no head twin to leave out")
    model = fresh_tiny
    fast = fast_forward.FastForward(model, pack=False, formats=())
    head = model.get_output_embeddings()
    twin = formats.make_linear(head.weight.detach(), head.bias, formats.BFLOAT16)
    fast.lm_head.use_fast(twin)
    check = fast_forward.check_against_transformers(model, fast)
    assert check.passed and check.max_rel_error < 1e-4 and check.tolerance == fast_forward.TOLERANCE[torch.float32]
    assert fast.lm_head.fast is twin  # the twin ranks again once the check is done
    hidden = torch.randn(3, model.config.hidden_size)
    with torch.inference_mode():
        exact, ranked = fast.lm_head.exact(hidden), fast.lm_head.leading(hidden, 8)
    assert not torch.equal(exact, ranked)  # the rounding the check leaves out is there while serving
    assert torch.equal(exact.argmax(-1), ranked.argmax(-1))


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


@pytest.fixture
def deep_tiny(tmp_path):
    """A tiny Llama six layers deep: deeper than the check's and the measurement's budgets."""
    from engine.load.loader import load_model
    from tests.helpers import make_tiny_llama

    return load_model(str(make_tiny_llama(tmp_path / "deep", layers=6)), LoadOptions(dtype="float32")).model


def _calls_per_layer(modules: list[torch.nn.Module]) -> list[list[int]]:
    """Hooks counting each module's calls and the rows of each call: [module][call] -> rows."""
    seen: list[list[int]] = [[] for _ in modules]
    for index, module in enumerate(modules):
        module.register_forward_hook(lambda _m, args, _out, index=index: seen[index].append(args[0].shape[-2]))
    return seen


def test_the_check_runs_a_few_layers_and_a_short_prompt_whatever_the_depth(deep_tiny) -> None:
    """The check compares transformers' forward over the same as-stored modules with the lean forward's Python
    layers and compiled step, on the first CHECK_LAYERS layers and 26 tokens only."""
    from tests.helpers import hold_as_stored

    model = hold_as_stored(deep_tiny, "int4", embed="int8", head="int8")
    fast = fast_forward.FastForward(model)
    reference = _calls_per_layer(list(model.model.layers))
    lean = _calls_per_layer([layer[0] for layer in fast.linears[fast.stored_format].layers])  # each layer's qkv
    check = fast_forward.check_against_transformers(model, fast)
    assert check.passed and check.against == "transformers" and check.layers == "2 of 6 layers"
    assert reference == [[26], [26], [], [], [], []]  # one pass of the 26 tokens over the first two layers
    assert all(not calls for calls in lean[2:])  # the lean forward's deeper layers untouched
    assert sum(sum(calls) for calls in lean[:2]) == 2 * 26  # prefill, chunk and decodes: 26 rows per layer
    assert model.config.num_hidden_layers == 6


def test_the_format_measurement_touches_a_few_layers_and_says_so(deep_tiny, monkeypatch, tmp_path) -> None:
    from engine.model import formats

    monkeypatch.setattr(formats, "_store", lambda: tmp_path / "weight-formats.json")  # measured, not remembered
    monkeypatch.setattr(fast_forward, "BUDGET_MAX_LAYERS", 2)
    messages: list[str] = []
    native = _calls_per_layer([layer.self_attn.q_proj for layer in deep_tiny.model.layers])
    fast = fast_forward.build(deep_tiny, formats=(formats.FLOAT32, formats.INT8), progress=messages.append)
    assert fast is not None and set(fast.choice.timings_ms) == {formats.FLOAT32, formats.INT8}
    assert fast.choice.measured_on == "2 of 6 layers" and "over 2 of 6 layers" in fast.choice.describe()
    assert messages[0] == "measuring weight formats (float32, int8) on 2 of 6 layers"
    assert messages[1] == "checking the fast path on 2 layers"
    assert all(not calls for calls in native[2:])  # the model's own modules of deeper layers never ran
    if formats.INT8 not in fast.choice.formats:  # the copies made to measure it are gone, none made for the rest
        assert not fast._copies and set(fast.linears) == {formats.FLOAT32}
    else:
        assert len(fast.linears[formats.INT8].layers) == 6


def test_a_layout_fault_in_the_as_stored_fusion_turns_the_lean_forward_off(deep_tiny, monkeypatch) -> None:
    """A fused int4 packing whose rows land in the wrong place: the check (against transformers' forward over the
    model's own modules) catches it."""
    from engine.model import stored
    from tests.helpers import hold_as_stored

    real = stored.fuse_int4

    def scrambled(group):
        fused = real(group)
        if fused is not None:
            fused.packed = fused.packed.flip(0).contiguous()
        return fused

    monkeypatch.setattr(stored, "fuse_int4", scrambled)
    model = hold_as_stored(deep_tiny, "int4")
    assert fast_forward.build(model) is None
    assert not fast_forward.rejected_check(model).passed
