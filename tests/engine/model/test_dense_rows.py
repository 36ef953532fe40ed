"""The claimed dot products for float32 and bfloat16 weights: within float32's summation bound of the exact product
at any shape, the same bits whichever thread took which rows, bad operands refused; the row counts that take them
measured (or forced, or left alone for tiny models); packed fused linears keep their plain rows without a copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.model import dense_rows, kernels
from engine.model import formats as formats_
from engine.model.quantized import HalfLinear
from tests.helpers import require_compiled_step


@pytest.fixture(scope="module", autouse=True)
def library() -> None:
    require_compiled_step()


def _claimed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.studio.dense_claimed_mm(x, w)


# rows, weight rows, inputs: one and several rows; weights of fewer rows than a claim, a ragged last claim and a
# ragged last block of 4; inputs not a multiple of 8, 16 or 32 lanes
SHAPES = [(1, 64, 576), (2, 37, 100), (5, 130, 33), (9, 16, 1536), (3, 5, 7), (4, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_the_product_is_within_float32_summation_of_the_exact_one(dtype, m: int, n: int, k: int) -> None:
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=generator).to(dtype)
    w = torch.randn(n, k, generator=generator).to(dtype)
    got = _claimed(x, w)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    exact = x.double() @ w.double().t()  # bfloat16 products are exact in float32: only the sums round
    bound = 2 * k * 2.0**-24 * (x.double().abs() @ w.double().abs().t())
    assert bool(((got.double() - exact).abs() <= bound + 1e-30).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_same_bits_whichever_thread_took_which_rows(dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(3, 300, generator=generator).to(dtype)
    w = torch.randn(1000, 300, generator=generator).to(dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = _claimed(x, w)
        torch.set_num_threads(max(2, threads))
        shared = [_claimed(x, w) for _ in range(5)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(alone, result) for result in shared)


@pytest.mark.parametrize(
    ("x", "w", "message"),
    [
        (torch.randn(2, 8), torch.randn(4, 8).bfloat16(), "dtype"),
        (torch.randn(2, 8), torch.randn(4, 6), r"\[4, 8\]"),
        (torch.randn(2, 8), torch.randn(8, 4).t(), "contiguous"),
        (torch.randn(2, 8).half(), torch.randn(4, 8).half(), "float32 or bfloat16"),
    ],
    ids=["mixed dtypes", "other width", "strided weight", "float16"],
)
def test_bad_operands_are_refused_with_a_clear_error(x, w, message: str) -> None:
    with pytest.raises((TypeError, ValueError, RuntimeError), match=message):
        _claimed(x, w)


def _weights(count: int, rows: int = 256, width: int = 1024, dtype=torch.float32):
    plain = [torch.randn(rows, width).to(dtype) for _ in range(count)]
    if dtype == torch.float32:
        return [(kernels.PackedLinear(w, None).packed, w) for w in plain]
    return [(None, w) for w in plain]


def test_forced_by_the_environment(monkeypatch) -> None:
    weights = _weights(1, 16, 16)
    monkeypatch.setattr(formats_, "measure", _not_measured)
    monkeypatch.setenv(dense_rows.ENV, "always")
    assert dense_rows.claimed_to(weights) == dense_rows.BUCKETS[-1]
    monkeypatch.setenv(dense_rows.ENV, "never")
    assert dense_rows.claimed_to(weights) == 0


def test_tiny_weights_stay_on_onednn_unmeasured(monkeypatch) -> None:
    monkeypatch.delenv(dense_rows.ENV, raising=False)
    monkeypatch.setattr(formats_, "measure", _not_measured)
    assert dense_rows.claimed_to(_weights(2, 64, 64)) == 0


def _not_measured(*args, **kwargs):
    raise AssertionError("nothing is measured here")


@pytest.mark.parametrize(
    ("winners", "rows"),
    [
        ({1: "c", 2: "c", 4: "o", 8: "o"}, 2),
        ({1: "c", 2: "c", 4: "c", 8: "c"}, 8),
        ({1: "o", 2: "c", 4: "c", 8: "c"}, 0),  # a run that does not start at one row is not taken
        ({1: "c", 2: "o", 4: "c", 8: "c"}, 1),
    ],
)
def test_the_claimed_rows_are_the_run_they_win_from_one_row(monkeypatch, winners: dict, rows: int) -> None:
    names = {"c": dense_rows.CLAIMED, "o": dense_rows.OTHERS}
    buckets = dict(zip(dense_rows.BUCKETS, [*winners.values(), *["o"] * len(dense_rows.BUCKETS)], strict=False))
    choice = formats_.FormatChoice({bucket: names[who] for bucket, who in buckets.items()})
    monkeypatch.delenv(dense_rows.ENV, raising=False)
    monkeypatch.setattr(dense_rows, "MIN_WEIGHTS", 0)
    seen = {}

    def measure(passes, buckets, key, budget_s):
        seen.update(passes=set(passes), buckets=buckets, key=key)
        return choice

    monkeypatch.setattr(formats_, "measure", measure)
    assert dense_rows.claimed_to(_weights(1, 16, 16)) == rows
    assert seen["passes"] == {dense_rows.CLAIMED, dense_rows.OTHERS} and seen["buckets"] == dense_rows.BUCKETS


@pytest.mark.parametrize(("claimed_ms", "rows"), [(9.0, 8), (9.7, 4)])
def test_a_bucket_is_taken_only_where_the_claimed_products_win_by_the_margin(claimed_ms: float, rows: int) -> None:
    """Measured timings decide with the margin: 9.7 ms against 10 is a win by 3 %, within what mixed steps lose."""
    others = dict.fromkeys(dense_rows.BUCKETS, 10.0)
    claimed = {bucket: 5.0 if bucket < 8 else claimed_ms if bucket == 8 else 20.0 for bucket in dense_rows.BUCKETS}
    chosen = {b: dense_rows.CLAIMED if claimed[b] < others[b] else dense_rows.OTHERS for b in dense_rows.BUCKETS}
    choice = formats_.FormatChoice(chosen, {dense_rows.CLAIMED: claimed, dense_rows.OTHERS: others})
    assert dense_rows.winning_run(choice) == rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_passes_multiply_every_weight_at_each_bucket(dtype) -> None:
    """The measurement's passes run prepacked (float32) or plain (bfloat16: at::linear) weights and the claimed
    products on rows cast to the weights' dtype, at every bucket's rows."""
    passes = dense_rows._passes(_weights(2, 32, 64, dtype))
    assert set(passes) == {dense_rows.CLAIMED, dense_rows.OTHERS}
    for rows in dense_rows.BUCKETS:
        for run in passes.values():
            run(rows)


def test_fused_packed_linears_keep_their_plain_rows_without_a_copy() -> None:
    """The originals are re-pointed at the fused plain rows the compiled step reads (one plain copy, as before)."""
    linears = [nn.Linear(32, rows, bias=False) for rows in (16, 8, 8)]
    x = torch.randn(3, 32)
    expected = torch.cat([m(x) for m in linears], dim=1)
    fused = kernels.fuse_linears(linears, pack=True)
    assert isinstance(fused, kernels.PackedLinear) and fused.plain is not None
    start = fused.plain.data_ptr()
    offsets = [m.weight.data_ptr() - start for m in linears]
    assert offsets == [0, 16 * 32 * 4, 24 * 32 * 4]  # slices of the fused rows: no copy of their own
    assert torch.allclose(fused(x), expected, atol=1e-5)
    assert torch.allclose(torch.cat([m(x) for m in linears], dim=1), expected)
    assert kernels.PackedLinear(torch.randn(4, 8), None).plain is None  # not kept unless shared


def test_a_16_bit_linear_takes_the_claimed_products_for_a_few_rows() -> None:
    """A stored bfloat16 weight (an LM head, layers the Python path runs): up to claimed_to rows by the claimed products
    (float32 sums, not rounded to bfloat16), more rows by at::linear; the same shapes and bias either way."""
    generator = torch.Generator().manual_seed(5)
    linear = HalfLinear(torch.randn(40, 24, generator=generator), torch.randn(40, generator=generator))
    few, many = torch.randn(2, 3, 24, generator=generator), torch.randn(9, 24, generator=generator)
    by_linear = linear(few)
    linear.claimed_to = 8
    by_claimed = linear(few)
    exact = few.bfloat16().double() @ linear.weight.double().t() + linear.bias.double()
    assert by_claimed.shape == by_linear.shape == (2, 3, 40)
    assert float((by_claimed.double() - exact).abs().max()) < 1e-4 < float((by_linear.double() - exact).abs().max())
    assert torch.equal(linear(many), torch.nn.functional.linear(many.bfloat16(), linear.weight).float() + linear.bias)
