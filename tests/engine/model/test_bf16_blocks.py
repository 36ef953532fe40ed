"""bfloat16 copies in the compiled library's blocks: the product within float32's summation bound of the exact one at
any shape (padding rows, two columns), the same bits whichever thread took which blocks, bad operands refused; held by
FormattedLinear where chosen (forced here), and which layout a machine takes decided by the measurement's rule."""

from __future__ import annotations

import pytest
import torch

from engine.model import bf16_blocks
from engine.model import formats as formats_
from tests.helpers import require_compiled_step


@pytest.fixture(scope="module", autouse=True)
def library() -> None:
    require_compiled_step()


def _product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.studio.bf16_blocks_mm(x, torch.ops.studio.bf16_blocks(w))


# rows: one; a few; more than a pass of each path (8, 12 x 2 blocks, 6 x 4 blocks) and a remainder
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 576), (3, 37, 100), (9, 130, 34), (30, 200, 96), (25, 70, 2)])
def test_the_product_is_within_float32_summation_of_the_exact_one(m: int, n: int, k: int) -> None:
    generator = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=generator).bfloat16()
    w = torch.randn(n, k, generator=generator)
    got = _product(x, w)
    assert got.dtype == torch.float32 and got.shape == (m, 16 * -(-n // 16))
    assert torch.equal(got[:, n:], torch.zeros(m, got.shape[1] - n))  # the padding rows are zero
    exact = x.double() @ w.bfloat16().double().t()
    bound = 2 * k * 2.0**-24 * (x.double().abs() @ w.bfloat16().double().abs().t())
    assert bool(((got[:, :n].double() - exact).abs() <= bound + 1e-30).all())


def test_the_same_bits_whichever_thread_took_which_blocks() -> None:
    generator = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 256, generator=generator).bfloat16(), torch.randn(1000, 256, generator=generator)
    blocks = torch.ops.studio.bf16_blocks(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.ops.studio.bf16_blocks_mm(x, blocks)
        torch.set_num_threads(max(2, threads))
        shared = [torch.ops.studio.bf16_blocks_mm(x, blocks) for _ in range(5)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(alone, result) for result in shared)


def test_bad_operands_are_refused_with_a_clear_error() -> None:
    with pytest.raises((ValueError, RuntimeError), match="K even"):
        torch.ops.studio.bf16_blocks(torch.randn(4, 7))
    blocks = torch.ops.studio.bf16_blocks(torch.randn(4, 8))
    with pytest.raises((ValueError, RuntimeError), match=r"\[blocks, 5, 16, 2\]"):
        torch.ops.studio.bf16_blocks_mm(torch.randn(2, 10).bfloat16(), blocks)
    with pytest.raises((TypeError, RuntimeError), match="bfloat16 rows"):
        torch.ops.studio.bf16_blocks_mm(torch.randn(2, 8), blocks)


@pytest.mark.parametrize("forced", ["always", "never"])
def test_a_bfloat16_copy_is_held_as_the_machine_chose(monkeypatch, forced: str) -> None:
    """FormattedLinear in blocks (float32 sums) or oneDNN's packing (rounded to bfloat16): the same linear either way,
    any leading dims, the bias added in float32."""
    if forced == "never" and not formats_.bfloat16_usable(torch.device("cpu")):
        pytest.skip("oneDNN's bfloat16 packing does not run on this CPU (AVX2 only)")
    monkeypatch.setenv(bf16_blocks.ENV, forced)
    generator = torch.Generator().manual_seed(11)
    weight, bias = torch.randn(40, 24, generator=generator), torch.randn(40, generator=generator)
    linear = formats_.FormattedLinear(weight, bias, formats_.BFLOAT16)
    assert (linear.blocks is not None) == (forced == "always") and (linear.packed is None) == (forced == "always")
    x = torch.randn(2, 3, 24, generator=generator)
    got = linear(x)
    exact = x.bfloat16().double() @ weight.bfloat16().double().t() + bias.double()
    assert got.shape == (2, 3, 40)
    error = float((got.double() - exact).abs().max())
    assert error < (1e-4 if forced == "always" else 5e-2)


def test_the_machine_takes_blocks_where_they_win_one_row_and_give_little_at_more() -> None:
    def choice(blocks: dict[int, float]) -> formats_.FormatChoice:
        onednn = dict.fromkeys(bf16_blocks.BUCKETS, 10.0)
        chosen = {rows: bf16_blocks.BLOCKS if blocks[rows] < 10 else bf16_blocks.ONEDNN for rows in blocks}
        return formats_.FormatChoice(chosen, {bf16_blocks.ONEDNN: onednn, bf16_blocks.BLOCKS: blocks})

    assert bf16_blocks.wins(choice({1: 8.0, 16: 10.8, 64: 9.0}))  # 8 % behind at 16 rows: within GIVE
    assert not bf16_blocks.wins(choice({1: 9.7, 16: 9.0, 64: 9.0}))  # one row by only 3 %
    assert not bf16_blocks.wins(choice({1: 8.0, 16: 11.5, 64: 9.0}))  # 15 % behind at 16 rows
    assert not bf16_blocks.wins(choice({1: 8.0, 16: 10.0, 64: 12.0}))


def test_forced_or_not_the_process_decides_once_per_setting(monkeypatch) -> None:
    monkeypatch.setattr(bf16_blocks, "_decided", {})
    calls = []
    monkeypatch.setattr(bf16_blocks, "_decide", lambda forced, _progress: calls.append(forced) or forced == "always")
    for forced in ("always", "always", "never", "always"):
        monkeypatch.setenv(bf16_blocks.ENV, forced)
        assert bf16_blocks.use_blocks() == (forced == "always")
    assert calls == ["always", "never"]
