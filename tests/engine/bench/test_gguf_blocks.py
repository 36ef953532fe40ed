"""The block writer: every block it packs reads back through gguf's own dequantizer as the values it meant, and its
random blocks look like real weights; the Q4_K_M mix follows llama.cpp's rule."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.bench import gguf_blocks as blocks
from engine.bench.gguf_mix import q4_k_m_type, tensor_type, use_more_bits

Q = gguf.GGMLQuantizationType


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def read_back(packed: np.ndarray, qtype) -> np.ndarray:
    assert packed.dtype == np.uint8 and packed.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][1] == 0
    return gguf.quants.dequantize(packed, qtype)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_q4_k_blocks_read_back_as_scale_times_code_minus_min(rng) -> None:
    n = 64  # every code, scale and min value, the 6-bit extremes included
    d, dmin = rng.uniform(1e-4, 1e-2, n), rng.uniform(1e-4, 1e-2, n)
    scales, mins = rng.integers(0, 64, (n, 8)), rng.integers(0, 64, (n, 8))
    scales[0], mins[0] = 63, 63
    codes = rng.integers(0, 16, (n, 256))
    expected = (f16(d)[:, None, None] * scales[:, :, None] * codes.reshape(n, 8, 32)) - (
        f16(dmin)[:, None, None] * mins[:, :, None]
    )
    got = read_back(blocks.pack_q4_k(d, dmin, scales, mins, codes), Q.Q4_K)
    np.testing.assert_allclose(got, expected.reshape(n, 256), rtol=1e-6, atol=1e-9)


def test_q5_k_blocks_read_back_with_their_fifth_bits(rng) -> None:
    n = 64
    d, dmin = rng.uniform(1e-4, 1e-2, n), rng.uniform(1e-4, 1e-2, n)
    scales, mins = rng.integers(0, 64, (n, 8)), rng.integers(0, 64, (n, 8))
    codes = rng.integers(0, 32, (n, 256))
    expected = (f16(d)[:, None, None] * scales[:, :, None] * codes.reshape(n, 8, 32)) - (
        f16(dmin)[:, None, None] * mins[:, :, None]
    )
    got = read_back(blocks.pack_q5_k(d, dmin, scales, mins, codes), Q.Q5_K)
    np.testing.assert_allclose(got, expected.reshape(n, 256), rtol=1e-6, atol=1e-9)


def test_q6_k_blocks_read_back_as_scale_times_centred_code(rng) -> None:
    n = 64
    d = rng.uniform(1e-5, 1e-3, n)
    scales = rng.integers(-128, 128, (n, 16))
    codes = rng.integers(0, 64, (n, 256))
    expected = f16(d)[:, None, None] * scales[:, :, None] * (codes.reshape(n, 16, 16) - 32)
    got = read_back(blocks.pack_q6_k(d, scales, codes), Q.Q6_K)
    np.testing.assert_allclose(got, expected.reshape(n, 256), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    ("qtype", "low", "high", "centre"),
    [(Q.Q4_0, 0, 16, 8), (Q.Q4_1, 0, 16, None), (Q.Q5_0, 0, 32, 16), (Q.Q8_0, -127, 128, 0)],
)
def test_the_32_value_blocks_read_back(rng, qtype, low, high, centre) -> None:
    n = 64
    d, m = rng.uniform(1e-4, 1e-2, n), rng.uniform(-0.1, 0.1, n)
    codes = rng.integers(low, high, (n, 32))
    if qtype is Q.Q4_1:
        packed, expected = blocks.pack_q4_1(d, m, codes), f16(d)[:, None] * codes + f16(m)[:, None]
    elif qtype is Q.Q4_0:
        packed, expected = blocks.pack_q4_0(d, codes), f16(d)[:, None] * (codes - centre)
    elif qtype is Q.Q5_0:
        packed, expected = blocks.pack_q5_0(d, codes), f16(d)[:, None] * (codes - centre)
    else:
        packed, expected = blocks.pack_q8_0(d, codes), f16(d)[:, None] * codes
    np.testing.assert_allclose(read_back(packed, qtype), expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("qtype", blocks.WRITABLE)
def test_random_blocks_look_like_real_weights(rng, qtype) -> None:
    rows, cols = 256, 1024
    packed = blocks.random_rows(qtype, rows, cols, rng, std=0.02)
    assert packed.shape == (rows, blocks.row_bytes(qtype, cols))
    values = read_back(packed, qtype)
    assert values.shape == (rows, cols) and np.isfinite(values).all()
    assert values.std() == pytest.approx(0.02, rel=0.1)
    # zero-centred: the mean is within sampling noise (5 standard errors) of 0
    assert abs(values.mean()) < 5 * 0.02 / np.sqrt(values.size)
    assert len(np.unique(values[0])) > 8  # codes spread over the range, not a constant


def test_rows_that_do_not_fill_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        blocks.row_bytes(Q.Q4_K, 896)


def test_use_more_bits_picks_about_half_the_layers_as_llama_cpp_does() -> None:
    chosen = [i for i in range(36) if use_more_bits(i, 36)]
    # first and last eighth (0-3, 31-35), then every third layer from 6
    assert chosen == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
    assert 12 <= sum(use_more_bits(i, 28) for i in range(28)) <= 16


def test_the_q4_k_m_mix() -> None:
    # 3B (tied embeddings, rows of 2048): Q4_K, Q6_K for attn_v/ffn_down where use_more_bits, Q6_K embedding
    assert q4_k_m_type("token_embd.weight", 2048, 36, tied=True) == Q.Q6_K
    assert q4_k_m_type("blk.0.attn_v.weight", 2048, 36, tied=True) == Q.Q6_K
    assert q4_k_m_type("blk.4.attn_v.weight", 2048, 36, tied=True) == Q.Q4_K
    assert q4_k_m_type("blk.6.ffn_down.weight", 11008, 36, tied=True) == Q.Q6_K
    assert q4_k_m_type("blk.6.ffn_up.weight", 2048, 36, tied=True) == Q.Q4_K
    # 7B (an output matrix of its own): the embedding stays Q4_K, the output gets Q6_K
    assert q4_k_m_type("token_embd.weight", 3584, 28, tied=False) == Q.Q4_K
    assert q4_k_m_type("output.weight", 3584, 28, tied=False) == Q.Q6_K
    # 0.5B's rows of 896 are no whole super-block: llama.cpp falls back to Q5_0 / Q8_0
    assert q4_k_m_type("blk.5.attn_q.weight", 896, 24, tied=True) == Q.Q5_0
    assert q4_k_m_type("blk.0.attn_v.weight", 896, 24, tied=True) == Q.Q8_0
    assert q4_k_m_type("token_embd.weight", 896, 24, tied=True) == Q.Q8_0
    assert q4_k_m_type("blk.0.ffn_down.weight", 4864, 24, tied=True) == Q.Q6_K
    assert tensor_type("q4_k_m", "blk.0.attn_norm.weight", (896,), 24, True) == Q.F32
    assert tensor_type("q4_1", "blk.0.attn_q.weight", (896, 896), 24, True) == Q.Q4_1
