"""What the picker says of a weight format's decode speed comes from a measurement on the model's layer shapes."""

from __future__ import annotations

import re

import pytest

from engine.load.decode_probe import compare_note, decode_ms
from engine.load.estimate import ModelShape
from engine.load.options import LoadOptions, resolve_options

SHAPE = ModelShape(
    architecture="LlamaForCausalLM", num_layers=4, num_kv_heads=2, head_dim=32, context_length=2048,
    parameters=4_000_000, quantizable_parameters=3_000_000, quantizable_rows=4096, hidden_size=256,
    intermediate_size=512, num_heads=8,
)  # fmt: skip


def test_every_cpu_path_is_measured() -> None:
    """Every path this CPU's torch runs is measured; one it lacks (bfloat16 under an AVX2 oneDNN) is None, not a
    guess."""
    import torch

    from engine.model import formats

    for path in ("float32", "bfloat16", "int8", "int4", "bitsandbytes nf4"):
        measured = decode_ms(SHAPE, path, repeats=1)
        if path in (formats.BFLOAT16, formats.INT8, formats.INT4) and not formats.usable(path, torch.device("cpu")):
            assert measured is None, path
        else:
            assert (measured or 0) > 0, path


def test_the_note_compares_with_float32_and_says_where_it_was_measured() -> None:
    note = compare_note(SHAPE, "nf4", dtype_auto=True)
    assert re.match(
        r"decode with bitsandbytes nf4 weights: (\d+\.\d+x (faster|slower)|as fast) than float32 here", note
    )
    assert "measured on this model's layer shapes" in note
    assert compare_note(SHAPE, "none", dtype_auto=False) == ""  # an explicit float32: nothing to compare


def test_a_missing_kernel_is_said_not_guessed(monkeypatch) -> None:
    from engine.load import decode_probe

    monkeypatch.setattr(decode_probe, "_builder", lambda path: lambda w: (_ for _ in ()).throw(RuntimeError("no")))
    assert decode_ms(SHAPE, "int4") is None
    assert compare_note(SHAPE, "int4", dtype_auto=True) == "int4: not measurable on this machine"


def test_engine_quantization_is_cpu_only_and_holds_the_engines_modules(tiny_model_dir) -> None:
    from engine.errors import UnsupportedOptionError
    from engine.load.loader import load_model

    assert resolve_options(LoadOptions(quantization="int4", device="cpu")).engine_quantized
    with pytest.raises(UnsupportedOptionError, match="GPU choose nf4"):
        from engine.load.options import quantization_problem

        raise UnsupportedOptionError(quantization_problem("int4", "cuda"))
    loaded = load_model(str(tiny_model_dir), LoadOptions(quantization="int4"))
    assert loaded.info.quantization == "int4"
    assert type(loaded.model.model.layers[0].mlp.down_proj).__name__ == "Int4Linear"  # the engine's kernel, not bnb
