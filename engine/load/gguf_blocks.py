"""GGUF's quantized blocks decoded with torch (multi-threaded, vectorized: the gguf package's numpy decoders run at a
few tens of million weights a second, too slow for a 7B file): into 4-bit codes with a scale and zero per group of
32 (Q4_0, Q4_1, Q4_K: torch's int4 layout holds them as they are), or into float32 rows. Types without a decoder here
fall back to the gguf package's, a chunk of rows at a time."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
#: the block types whose 4-bit codes map onto torch's int4 groups of 32 without requantizing
INT4_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q4_K})
#: types decoded here (others go through the gguf package's numpy decoders)
DECODED = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0})
FLOAT_TYPES = frozenset({Q.F32, Q.F16, Q.BF16})


def bits_per_weight(kind: GGMLQuantizationType) -> float:
    block, size = GGML_QUANT_SIZES[kind]
    return size * 8 / block


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at byte `offset` of every block, as float32 [blocks, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """qs uint8 [blocks, chunks * width] -> [blocks, chunks * 2 * width]: each chunk's low nibbles, then its high ones
    (how Q4_0/Q4_1/Q5_x lay out one block, and Q4_K/Q5_K each 64 weights)."""
    chunks = qs.reshape(qs.shape[0], -1, 1, width)
    return torch.cat([chunks & 0xF, chunks >> 4], dim=2).view(qs.shape[0], -1)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit minimums per block (float32 [blocks, 8] each)."""
    parts = scales.reshape(-1, 3, 4)
    d, m, md = parts[:, 0], parts[:, 1], parts[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes of high bits -> [blocks, 32] (bit j of the little-endian word is weight j's)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh[:, :, None] >> shifts) & 1).view(qh.shape[0], 32)


def int4_groups(raw: torch.Tensor, kind: GGMLQuantizationType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """raw uint8 [rows, bytes] of Q4_0/Q4_1/Q4_K -> (codes uint8 [rows, K], scale, zero float32 [rows, K/32]) with
    w = (code - 8) * scale + zero: the file's own codes, its scales and minimums rearranged."""
    rows = raw.shape[0]
    block, size = GGML_QUANT_SIZES[kind]
    blocks = raw.reshape(-1, size)
    if kind == Q.Q4_0:  # w = d * (q - 8)
        scale = _half(blocks, 0)
        codes, zero = _nibbles(blocks[:, 2:], 16), torch.zeros_like(scale)
    elif kind == Q.Q4_1:  # w = d * q + m
        scale, minimum = _half(blocks, 0), _half(blocks, 2)
        codes, zero = _nibbles(blocks[:, 4:], 16), minimum + 8 * scale
    elif kind == Q.Q4_K:  # w = d * sc_j * q - dmin * m_j over 8 groups of 32
        sc, mn = _k_scales(blocks[:, 4:16])
        scale = _half(blocks, 0) * sc
        codes, zero = _nibbles(blocks[:, 16:], 32), 8 * scale - _half(blocks, 2) * mn
    else:
        raise ValueError(f"{kind.name} has no 4-bit groups")
    groups = raw.shape[1] // size * block // 32
    return codes.reshape(rows, -1), scale.reshape(rows, groups), zero.reshape(rows, groups)


def dequantize(raw: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    """raw [rows, bytes] (uint8; or the float array itself for F32/F16) -> float32 [rows, K], computed as the gguf
    package computes it (same operations in float32, so the same values)."""
    if kind == Q.F32:
        return raw.view(torch.float32).reshape(raw.shape[0], -1).float()
    if kind == Q.F16:
        return raw.view(torch.float16).reshape(raw.shape[0], -1).float()
    if kind == Q.BF16:
        return raw.view(torch.bfloat16).reshape(raw.shape[0], -1).float()
    if kind not in DECODED:
        return _numpy_dequantize(raw, kind)
    rows = raw.shape[0]
    block, size = GGML_QUANT_SIZES[kind]
    blocks = raw.reshape(-1, size)
    if kind == Q.Q4_0:
        out = _half(blocks, 0) * (_nibbles(blocks[:, 2:], 16).to(torch.int8) - 8).float()
    elif kind == Q.Q4_1:
        out = _half(blocks, 0) * _nibbles(blocks[:, 4:], 16).float() + _half(blocks, 2)
    elif kind == Q.Q5_0:
        q = _nibbles(blocks[:, 6:], 16) | (_fifth_bits(blocks[:, 2:6]) << 4)
        out = _half(blocks, 0) * (q.to(torch.int8) - 16).float()
    elif kind == Q.Q5_1:
        q = _nibbles(blocks[:, 8:], 16) | (_fifth_bits(blocks[:, 4:8]) << 4)
        out = _half(blocks, 0) * q.float() + _half(blocks, 2)
    elif kind == Q.Q8_0:
        out = blocks[:, 2:].contiguous().view(torch.int8).float() * _half(blocks, 0)
    elif kind in (Q.Q4_K, Q.Q5_K):
        sc, mn = _k_scales(blocks[:, 4:16])
        d = (_half(blocks, 0) * sc)[..., None]
        dm = (_half(blocks, 2) * mn)[..., None]
        if kind == Q.Q4_K:
            q = _nibbles(blocks[:, 16:], 32)
        else:
            high = (blocks[:, 16:48].reshape(-1, 1, 32) >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1
            q = _nibbles(blocks[:, 48:], 32) | (high.view(-1, 256) << 4)
        out = d * q.view(-1, 8, 32).float() - dm
    else:  # Q6_K: ql[128], qh[64], scales int8[16], d
        low = _nibbles(blocks[:, :128], 64)  # [blocks, 256]: per 128 weights, ql's 64 low nibbles then 64 high
        high = (blocks[:, 128:192].reshape(-1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]) & 3
        q = (low | (high.view(-1, 256) << 4)).to(torch.int8) - 32
        d = (_half(blocks, 208) * blocks[:, 192:208].contiguous().view(torch.int8).float())[..., None]
        out = d * q.view(-1, 16, 16).float()
    return out.reshape(rows, raw.shape[1] // size * block)


def _numpy_dequantize(raw: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    import gguf

    try:
        values = gguf.quants.dequantize(raw.numpy(), kind)
    except NotImplementedError:
        raise ValueError(f"the gguf package cannot decode {kind.name} blocks") from None
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def can_decode(kind: GGMLQuantizationType) -> bool:
    """Whether blocks of this type can be turned into float rows here (ours or the gguf package's decoder)."""
    if kind in DECODED:
        return True
    import gguf

    _block, size = GGML_QUANT_SIZES[kind]
    try:
        gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), kind)
    except (NotImplementedError, ValueError, KeyError):
        return False
    return True
