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


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_stored_head_may_rank_with_int8_activations_and_still_picks_the_exact_leaders(library, kind, monkeypatch):
    """Where one row through int8 activations is measured faster (forced here), a stored head ranks with them: their
    rounding reorders near-ties (a hundred tokens within 0.1 % of each other), yet the bound recomputes every token
    that can lead, so greedy picks and top-k sets are the exact head's."""
    if not torch.ops.studio.int4_vnni():
        pytest.skip("this CPU or build has no VNNI products: the head keeps its kernel")
    generator = torch.Generator().manual_seed(11)
    hidden = torch.randn(6, 192, generator=generator)
    weight = torch.randn(1504, 192, generator=generator) * 0.05
    for row in range(6):  # per hidden row, 100 tokens whose logits are 5 + up to 5e-3, above every other token
        h = hidden[row]
        across = torch.randn(100, 192, generator=generator) * 0.02  # each its own error: they reorder
        across -= (across @ h)[:, None] * h / h.norm() ** 2
        weight[100 * row : 100 * row + 100] = 5 * h / h.norm() ** 2 * (1 + 1e-3 * torch.rand(100, 1)) + across
    module = Int8Linear(weight, None) if kind == "int8" else Int4Linear(weight, None)
    monkeypatch.setattr(lm_head.Int8ActivationsHead, "measured", classmethod(lambda cls, m: cls(m)))
    head = lm_head.LMHead.stored(module)
    assert isinstance(head.fast, lm_head.Int8ActivationsHead)
    with torch.inference_mode():
        exact = head.exact(hidden)
        ranked = head.fast(hidden)
        # their rounding does reorder the near-ties
        assert not torch.equal(ranked.topk(40).indices.sort().values, exact.topk(40).indices.sort().values)
        greedy = head.leading(hidden, lm_head.CANDIDATES)
        assert torch.equal(greedy.argmax(-1), exact.argmax(-1))
        top = head.leading(hidden, 40 + lm_head.TOP_K_MARGIN)
        for got, want in zip(torch.topk(top, 40).indices, torch.topk(exact, 40).indices, strict=True):
            assert set(got.tolist()) == set(want.tolist())


FRESH_PROCESS = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from engine.model import fast_forward
from tests.helpers import hold_as_stored
config = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
model = hold_as_stored(LlamaForCausalLM(config).eval(), "int8", head="int8")
print(type(fast_forward.FastForward(model).lm_head.fast).__name__)
"""


def test_a_fresh_process_loads_the_products_before_it_makes_the_head(library) -> None:
    """The head is made before the compiled steps are built: a process whose library was not loaded yet (a bench, the
    window) still ranks a stored head with int8 activations where they are chosen (forced here)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from engine.model import tiles

    if not torch.ops.studio.int4_vnni():
        pytest.skip("this CPU or build has no VNNI products: the head keeps its kernel")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, tiles.VNNI_ENV: "always", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "Int8ActivationsHead"
