"""GGML quantized blocks written from chosen integer codes and scales: the K-quants Q4_K, Q5_K and Q6_K (which the
gguf package reads but cannot write), Q4_0, Q4_1, Q5_0 and Q8_0, and random blocks of each shaped like real weights
(zero-centred, finite)."""

from __future__ import annotations

import functools
import math

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

QK_K = 256  # values in a K-quant super-block
Q = GGMLQuantizationType
WRITABLE = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def _nibbles(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return (low.astype(np.uint8) & 0x0F) | (high.astype(np.uint8) << 4)


def _k_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """The 12 bytes holding eight 6-bit scales and eight 6-bit mins (Q4_K and Q5_K)."""
    sc, mn = scales.astype(np.uint8), mins.astype(np.uint8)
    packed = np.empty((sc.shape[0], 12), np.uint8)
    # the first four scales and mins sit whole in bytes 0-7; the last four are split: their low nibbles in
    # bytes 8-11, their top two bits in the free top bits of bytes 0-7
    packed[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return packed


def _k_low_nibbles(codes: np.ndarray) -> np.ndarray:
    pairs = (codes.astype(np.uint8) & 0x0F).reshape(-1, 4, 2, 32)  # sub-blocks 2k and 2k+1 share 32 bytes
    return _nibbles(pairs[:, :, 0], pairs[:, :, 1]).reshape(-1, 128)


def pack_q4_k(d: np.ndarray, dmin: np.ndarray, scales: np.ndarray, mins: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Blocks whose value i of sub-block j is d * scales[j] * codes[i] - dmin * mins[j] (scales, mins: 6-bit,
    8 per block; codes 0..15, 256 per block), as ggml's block_q4_K lays them out (144 bytes)."""
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(scales, mins), _k_low_nibbles(codes)], axis=1)


def pack_q5_k(d: np.ndarray, dmin: np.ndarray, scales: np.ndarray, mins: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """As Q4_K with codes 0..31: the fifth bits in 32 bytes, bit j of byte k for value k of sub-block j (176 bytes)."""
    fifth = (codes.astype(np.uint8) >> 4).reshape(-1, 8, 32)
    qh = np.zeros((fifth.shape[0], 32), np.uint8)
    for j in range(8):
        qh |= fifth[:, j] << j
    parts = [_f16_bytes(d), _f16_bytes(dmin), _k_scales(scales, mins), qh, _k_low_nibbles(codes)]
    return np.concatenate(parts, axis=1)


def pack_q6_k(d: np.ndarray, scales: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Blocks whose value i is d * scales[i // 16] * (codes[i] - 32) (scales int8, 16 per block; codes 0..63),
    as ggml's block_q6_K lays them out (210 bytes)."""
    n = codes.shape[0]
    q = codes.astype(np.uint8)
    low = (q & 0x0F).reshape(n, 2, 2, 64)  # per half of 128 values: values 0-63 low nibbles, 64-127 high
    ql = _nibbles(low[:, :, 0], low[:, :, 1]).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)  # per half: four runs of 32 values share bytes, two bits each
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, scales.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)


def pack_q4_0(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Blocks of 32 whose value i is d * (codes[i] - 8) (codes 0..15)."""
    return np.concatenate([_f16_bytes(d), _nibbles(codes[:, :16], codes[:, 16:])], axis=1)


def pack_q4_1(d: np.ndarray, m: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Blocks of 32 whose value i is d * codes[i] + m (codes 0..15)."""
    qs = _nibbles(codes[:, :16], codes[:, 16:])
    return np.concatenate([_f16_bytes(d), _f16_bytes(m), qs], axis=1)


def pack_q5_0(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Blocks of 32 whose value i is d * (codes[i] - 16) (codes 0..31): the fifth bits packed in a uint32."""
    q = codes.astype(np.uint8)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")  # 4 bytes: bit i is value i's fifth bit
    return np.concatenate([_f16_bytes(d), qh, _nibbles(q[:, :16], q[:, 16:])], axis=1)


def pack_q8_0(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Blocks of 32 whose value i is d * codes[i] (codes -127..127)."""
    return np.concatenate([_f16_bytes(d), codes.astype(np.int8).view(np.uint8)], axis=1)


def block_size(qtype: GGMLQuantizationType) -> int:
    """Values per block."""
    return GGML_QUANT_SIZES[qtype][0]


def row_bytes(qtype: GGMLQuantizationType, cols: int) -> int:
    values, size = GGML_QUANT_SIZES[qtype]
    if cols % values:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {values} values, not {cols}")
    return cols // values * size


# Codes as a quantizer gives them for normal weights: x = z * levels_per_std, rounded symmetrically (floor + 1/2 for
# the types whose zero sits between two codes), clipped to the type's range. Drawn through a 16-bit inverse-CDF
# table: about ten times faster than drawing normals, which matters for the 7B's 6.9 billion values.
CODES = {  # type: (levels per std, offset of zero, rounding, lowest, highest)
    Q.Q4_K: (3.0, 8, "floor", 0, 15),
    Q.Q5_K: (6.0, 16, "floor", 0, 31),
    Q.Q4_0: (3.0, 8, "round", 0, 15),
    Q.Q4_1: (3.0, 8, "floor", 0, 15),
    Q.Q5_0: (4.0, 16, "round", 0, 31),
    Q.Q6_K: (8.0, 32, "round", 0, 63),
    Q.Q8_0: (32.0, 0, "round", -127, 127),
}


@functools.cache
def _code_table(qtype: GGMLQuantizationType) -> np.ndarray:
    """65536 entries: code = table[uniform 16-bit number], distributed as the rounded, clipped normal."""
    per_std, zero, rounding, low, high = CODES[qtype]
    codes = np.arange(low, high + 1)
    # the x interval each code collects (x = z * per_std, before the offset)
    lower = codes - zero - (0.0 if rounding == "floor" else 0.5)
    cdf = np.array([0.5 * (1 + math.erf(edge / per_std / math.sqrt(2))) for edge in lower[1:]])
    return codes[np.searchsorted(cdf * 65536, np.arange(65536), side="right")].astype(np.int16)


def random_codes(qtype: GGMLQuantizationType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    uniform = np.frombuffer(rng.bytes(2 * int(np.prod(shape))), np.uint16).reshape(shape)
    return _code_table(qtype)[uniform]


def random_blocks(qtype: GGMLQuantizationType, n: int, rng: np.random.Generator, std: float = 0.02) -> np.ndarray:
    """n valid blocks whose dequantized values look like a real layer's: about N(0, std), zero-centred (the codes
    are a normal sample rounded symmetrically), finite, with per-block scales that vary a little."""
    if qtype not in WRITABLE:
        raise ValueError(f"no block writer for {qtype.name}")
    per_std = CODES[qtype][0]
    codes = random_codes(qtype, (n, block_size(qtype)), rng)
    spread = (std * np.exp(rng.normal(0.0, 0.1, n))).astype(np.float32)  # real layers' blocks differ a little
    if qtype is Q.Q8_0:
        return pack_q8_0(spread / per_std, codes)
    if qtype is Q.Q5_0:
        return pack_q5_0(spread / per_std, codes)
    if qtype is Q.Q4_0:
        return pack_q4_0(spread / per_std, codes)
    if qtype is Q.Q4_1:
        d = _bits(spread / per_std, 7)
        return pack_q4_1(d, -7.5 * d, codes)  # codes centre on 7.5: m puts it exactly at zero
    if qtype is Q.Q6_K:
        scales = rng.integers(64, 128, (n, 16))
        return pack_q6_k(spread / per_std / 96, scales, codes)  # a step of about std / 8 at the middle scale
    # Q4_K/Q5_K: value = d * scale * code - dmin * min; min = scale and dmin = 7.5 d (15.5 d) put code 7.5 (15.5)
    # exactly at zero
    scales = rng.integers(40, 64, (n, 8))
    if qtype is Q.Q5_K:
        d = _bits(spread / per_std / 52, 6)
        return pack_q5_k(d, 15.5 * d, scales, scales, codes)
    d = _bits(spread / per_std / 52, 7)
    return pack_q4_k(d, 7.5 * d, scales, scales, codes)


def _bits(x: np.ndarray, bits: int) -> np.ndarray:
    """x rounded to `bits` significant bits, so 7.5 x (15 x / 2, with 7 bits) or 15.5 x (31 x / 2, with 6) is exact
    in float16's 11: the zero point has no rounding bias."""
    mantissa, exponent = np.frexp(x.astype(np.float32))
    return np.ldexp(np.round(mantissa * 2**bits) / 2**bits, exponent).astype(np.float32)


def random_rows(
    qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator, std: float = 0.02
) -> np.ndarray:
    """A (rows, row_bytes) uint8 tensor of random blocks, built a few MB at a time (a 7B embedding's float
    temporaries would be gigabytes)."""
    per_row = cols // block_size(qtype)
    out = np.empty((rows, row_bytes(qtype, cols)), np.uint8)
    chunk = max(1, (1 << 20) // cols)  # about a million values per chunk
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        blocks = random_blocks(qtype, (stop - start) * per_row, rng, std)
        out[start:stop] = blocks.reshape(stop - start, -1)
    return out
