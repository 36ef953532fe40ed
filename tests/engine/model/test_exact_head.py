"""The exact float32 head over int8 and int4 weights (the compiled library's int8_exact_mm and int4_exact_mm, which
DequantizedHead uses): the dequantized weights' product, the same for a row alone or among others, and the Python
blocks' values where the library is absent."""

from __future__ import annotations

import pytest
import torch

from engine.model import compiled_step, int4pack, lm_head
from engine.model.quantized import Int4Linear, Int8Linear


@pytest.fixture(scope="module")
def library() -> None:
    if not compiled_step.ensure_loaded():
        if compiled_step.failure_expected():
            pytest.skip(f"no compiled step here: {compiled_step.failure_reason()}")
        pytest.fail(f"the compiled step failed: {compiled_step.failure_reason()}")


def _module(kind: str, rows: int, features: int, bias: bool) -> Int8Linear | Int4Linear:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(rows, features, generator=generator) * 0.05
    bias_ = torch.randn(rows, generator=generator) if bias else None
    if kind == "int4" and int4pack.layout() is None:
        pytest.skip("this torch's int4 packing layout is unknown here")
    return Int8Linear(weight, bias_) if kind == "int8" else Int4Linear(weight, bias_)


def _exact(module: Int8Linear | Int4Linear, x: torch.Tensor) -> torch.Tensor:
    return lm_head._exact_kernel(module, x)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_the_kernels_compute_the_dequantized_weights_product(library, kind, rows) -> None:
    """1008 rows: whole int4 packing blocks and a short one, int8 blocks of 4 and a short one; 96 columns (int8: 37,
    fewer than a run of lanes, with a ragged end)."""
    features = 37 if kind == "int8" else 96
    module = _module(kind, 1003 if kind == "int8" else 1008, features, bias=False)
    x = torch.randn(rows, features, generator=torch.Generator().manual_seed(9))
    got = _exact(module, x)
    want = x.double() @ module.dequantize().double().t()
    assert got.shape == (rows, module.out_features) and got.dtype == torch.float32
    assert _error(got, want) < 1e-5  # float32 sums (in an order of their own) of the same float32 weights


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_row_gets_the_same_logits_alone_or_among_others(library, kind) -> None:
    module = _module(kind, 496, 320, bias=False)
    x = torch.randn(7, 320, generator=torch.Generator().manual_seed(2))
    together = _exact(module, x)
    for row in range(7):
        assert torch.equal(_exact(module, x[row : row + 1])[0], together[row])


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_head_uses_the_kernels_and_agrees_with_its_python_blocks(library, kind, monkeypatch) -> None:
    module = _module(kind, 1504, 192, bias=True)
    head = lm_head.DequantizedHead(module)
    x = torch.randn(5, 192, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    calls = []
    real = lm_head._exact_kernel
    monkeypatch.setattr(lm_head, "_exact_kernel", lambda *args: calls.append(1) or real(*args))
    with torch.inference_mode():
        fast = head(x)
        monkeypatch.setattr(lm_head, "_exact_kernels", lambda: False)  # as without the library: blocks of rows
        blocks = head(x)
    assert calls == [1]
    want = x.double() @ module.dequantize().double().t() + module.bias.double()
    assert _error(fast, want) < 1e-5 and _error(blocks, want) < 1e-6
