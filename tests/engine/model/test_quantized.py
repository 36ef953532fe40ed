"""The engine's weight modules: built from float weights or from already-quantized data, read back exactly as they
multiply, drop-in for nn.Linear and nn.Embedding in a float32 model."""

from __future__ import annotations

import pytest
import torch

from engine.model import int4pack
from engine.model.quantized import (
    INT4_GROUP,
    HalfLinear,
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    int4_groups_from_float,
    weight_format,
)


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


@pytest.mark.parametrize("n", [16, 40, 100, 176])  # full packing blocks, short ones, and rows padded to 16
def test_int4_from_groups_multiplies_with_exactly_the_codes_given(n: int) -> None:
    k = 96
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=generator)
    # scales and zeros that bfloat16 holds exactly: the module must then hold w = (code - 8) * scale + zero exactly
    scale = (torch.rand(n, k // INT4_GROUP, generator=generator) * 0.01).bfloat16().float()
    zero = (torch.randn(n, k // INT4_GROUP, generator=generator) * 0.01).bfloat16().float()
    bias = torch.randn(n, generator=generator)
    module = Int4Linear.from_groups(codes, scale, zero, bias)
    expected = ((codes.float() - 8).view(n, -1, INT4_GROUP) * scale[..., None] + zero[..., None]).view(n, k)
    assert torch.equal(module.dequantize(), expected)
    x = torch.randn(2, 3, k, generator=generator)
    out = module(x)
    assert out.shape == (2, 3, n) and out.dtype == torch.float32
    reference = x.bfloat16().float() @ expected.T + bias  # the kernel multiplies bfloat16 inputs
    assert torch.allclose(out, reference, atol=2e-3, rtol=1e-2)


def test_int4_and_int8_from_float_round_within_half_a_step() -> None:
    weight = _weight(64, 128)
    _codes, scale, _zero = int4_groups_from_float(weight)
    step = scale.repeat_interleave(INT4_GROUP, dim=1)
    assert ((Int4Linear(weight, None).dequantize() - weight).abs() <= 0.5 * step + 1e-3 * step.max()).all()
    rows = Int8Linear(weight, None)
    row_step = weight.abs().amax(1, keepdim=True) / 127
    assert ((rows.dequantize() - weight).abs() <= 0.5 * row_step * (1 + 2**-7)).all()


def test_int8_from_rows_keeps_the_rows_given() -> None:
    q = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    scale = torch.rand(32).bfloat16().float()
    module = Int8Linear.from_rows(q, scale)
    assert torch.equal(module.dequantize(), q.float() * scale[:, None])
    x = torch.randn(5, 64)
    assert torch.allclose(module(x), x.bfloat16().float() @ module.dequantize().T, rtol=1e-2, atol=1e-2)


def test_half_linear_computes_in_16_bits_and_answers_in_float32() -> None:
    weight = _weight(24, 40)
    module = HalfLinear(weight, torch.ones(24))
    out = module(torch.randn(3, 40))
    assert out.dtype == torch.float32 and module.weight.dtype == torch.bfloat16 and weight_format(module) == "bfloat16"


@pytest.mark.parametrize("fmt", [Int8Linear, Int4Linear])
def test_an_embedding_shares_its_tied_heads_bytes(fmt) -> None:
    weight = _weight(200, 64)
    head = fmt(weight, None)
    embedding = QuantizedEmbedding(head)
    ids = torch.tensor([[3, 199, 3], [0, 17, 128]])
    rows = embedding(ids)
    assert rows.shape == (2, 3, 64) and rows.dtype == torch.float32
    assert torch.equal(rows[1, 2], head.dequantize(torch.tensor([128]))[0])
    assert not list(embedding.buffers())  # no copy of its own: the head holds the bytes
    assert weight_format(embedding) == weight_format(head)


def test_an_untied_quantized_embedding_owns_its_rows() -> None:
    embedding = QuantizedEmbedding.from_float(_weight(50, 32), "int8", embed_scale=2.0)
    assert sum(b.numel() for b in embedding.buffers()) >= 50 * 32
    assert torch.allclose(embedding(torch.tensor([4])), 2 * embedding.rows_module.dequantize(torch.tensor([4])))


@pytest.mark.parametrize("layout", int4pack.CANDIDATES)
def test_every_known_packing_layout_reads_back_its_rows(layout: int4pack.Layout) -> None:
    codes = torch.randint(0, 16, (176, 64), dtype=torch.uint8)
    packed = layout.pack(codes)
    ids = torch.tensor([0, 5, 63, 64, 127, 160, 175])
    assert torch.equal(layout.rows(packed, ids, 64), codes[ids])


def test_the_packing_matches_torchs_own_packer_here() -> None:
    """Whatever this CPU's layout, packing the codes ourselves gives torch's bytes (or torch's packer is used)."""
    codes = torch.randint(0, 16, (112, 64), dtype=torch.uint8)
    expected = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), int4pack.INNER_K_TILES)
    assert torch.equal(int4pack.pack(codes), expected)


def test_as_stored_tiny_model_runs_the_transformers_forward(tiny_model_dir) -> None:
    from tests.helpers import make_tiny_as_stored

    reference = make_tiny_as_stored(tiny_model_dir, "bfloat16")  # near float32: the int formats must stay close
    ids = torch.tensor([[1, 5, 9, 11, 4]])
    with torch.inference_mode():
        expected = reference(input_ids=ids).logits
        for fmt in ("int8", "int4"):
            model = make_tiny_as_stored(tiny_model_dir, fmt)
            assert type(model.model.layers[0].mlp.down_proj).__name__ == f"Int{fmt[3]}Linear"
            assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
            logits = model(input_ids=ids).logits
            assert logits.dtype == torch.float32
            assert (logits - expected).abs().max() < 0.25 * expected.abs().max()


def test_int4_packed_chunk_by_chunk_equals_packed_whole() -> None:
    n, k = 200, 64  # chunks of 64 rows and a short last one that needs padding to 16
    generator = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=generator)
    scale, zero = torch.rand(n, 2, generator=generator), torch.rand(n, 2, generator=generator)
    whole = Int4Linear.from_groups(codes, scale, zero)
    chunks = [(codes[i : i + 64], scale[i : i + 64], zero[i : i + 64]) for i in range(0, n, 64)]
    chunked = Int4Linear.from_row_chunks(n, k, chunks)
    assert torch.equal(chunked.packed, whole.packed) and torch.equal(chunked.scales_and_zeros, whole.scales_and_zeros)
    with pytest.raises(ValueError, match="not a multiple of 64"):
        Int4Linear.from_row_chunks(n, k, [(codes[:40], scale[:40], zero[:40]), (codes[40:], scale[40:], zero[40:])])


@pytest.mark.parametrize("n", [176, 1040, 1056])  # a short last packing block; tiles of 1024 rows and the rest
def test_many_rows_multiply_unpacked_bfloat16_tiles_of_the_same_weights(n: int, monkeypatch) -> None:
    from engine.load import native
    from engine.model import quantized

    if quantized.int4_unpacker() is None:
        pytest.skip(f"no unpacker here: {native.unavailable_reason() or 'this packing layout is unknown'}")
    torch.manual_seed(n)
    module = Int4Linear(torch.randn(n, 96) * 0.05, torch.randn(n))
    unpack = quantized.int4_unpacker()
    padded = module.packed.shape[0]
    assert torch.equal(unpack(module.packed, module.scales_and_zeros, 0, padded)[:n], module.dequantize().bfloat16())
    x = torch.randn(quantized.UNPACK_FROM_ROWS + 3, 96)
    calls: list[int] = []
    monkeypatch.setattr(quantized, "int4_unpacker", lambda: lambda *a: (calls.append(a[2]), unpack(*a))[1])
    tiled = module(x)
    assert calls == list(range(0, padded, quantized.UNPACK_TILE_ROWS))  # every tile once
    expected = (x.bfloat16() @ module.dequantize().bfloat16().t()).float() + module.bias
    assert tiled.shape == (x.shape[0], n) and torch.allclose(tiled, expected, atol=2e-2, rtol=1e-2)
    kernel = torch.cat([module(x[i : i + 64]) for i in range(0, x.shape[0], 64)])  # the int4 kernel's rows
    assert torch.allclose(tiled, kernel, atol=2e-2, rtol=1e-2)


def test_many_rows_multiply_int8_weights_as_bfloat16_tiles_scaled_after() -> None:
    from engine.model import quantized

    torch.manual_seed(3)
    module = Int8Linear(torch.randn(1100, 80) * 0.05, torch.randn(1100))  # a tile of 1024 rows and the rest
    x = torch.randn(quantized.UNPACK_FROM_ROWS + 5, 80)
    tiled = module(x)
    kernel = torch.cat([module(x[i : i + 64]) for i in range(0, x.shape[0], 64)])  # the int8 kernel's rows
    exact = x @ module.dequantize().t() + module.bias
    assert torch.allclose(tiled, kernel, atol=2e-2, rtol=1e-2) and torch.allclose(tiled, exact, atol=3e-2, rtol=2e-2)
