"""torch's CPU int4 weight packing (`_convert_weight_to_int4pack_for_cpu`), done from 4-bit codes directly and undone
row by row: which of its layouts this torch and CPU use is found once by packing a probe, so a loader packs a GGUF
file's nibbles without the [N, K] int32 detour and a quantized embedding reads its rows from the LM head's packing."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

INNER_K_TILES = 2  # the argument torch's CPU packer takes (it ignores it); kept for the call
ROW_MULTIPLE = 16  # torch's CPU kernel takes blocks of 16, 32, 48 or 64 rows


@dataclass(frozen=True)
class Layout:
    """Rows come in blocks of `block` (the last one may be shorter: a multiple of 16). Within a full block the byte
    at [k, j] holds row j (low nibble) and row j + block/2 (high nibble) when `split`, else rows 2j and 2j+1, as
    every shorter block does. Block i starts at byte i * K * block / 2."""

    block: int
    split: bool

    def pack(self, codes: torch.Tensor) -> torch.Tensor:
        """codes uint8 [N, K] (0..15, N a multiple of 16) -> packed uint8 [N, K / 2]."""
        n, k = codes.shape
        full = n // self.block * self.block
        parts = []
        if full:
            blocks = codes[:full].view(full // self.block, self.block, k)
            if self.split:
                low, high = blocks[:, : self.block // 2], blocks[:, self.block // 2 :]
            else:
                pairs = blocks.view(full // self.block, self.block // 2, 2, k)
                low, high = pairs[:, :, 0], pairs[:, :, 1]
            parts.append((low | (high << 4)).transpose(1, 2).reshape(-1))
        if n > full:
            pairs = codes[full:].view((n - full) // 2, 2, k)
            parts.append((pairs[:, 0] | (pairs[:, 1] << 4)).t().reshape(-1))
        return torch.cat(parts).view(n, k // 2) if len(parts) > 1 else parts[0].view(n, k // 2)

    def pack_nibbles(self, qs: torch.Tensor) -> torch.Tensor:
        """GGUF's own 4-bit layout straight into this packing: qs uint8 [N, G, W], each byte holding the codes of
        columns i (low nibble) and W + i (high) of its group of 2W columns (Q4_0/Q4_1: W = 16, Q4_K: W = 32).
        Row pairs are combined byte-wise (no [N, K] array of codes is made): a few passes over K / 2 bytes a row."""
        n, groups, width = qs.shape
        k = groups * width * 2
        full = n // self.block * self.block
        parts = []
        if full:
            blocks = qs[:full].view(full // self.block, self.block, groups, width)
            if self.split:
                low, high = blocks[:, : self.block // 2], blocks[:, self.block // 2 :]
            else:
                pairs = blocks.view(full // self.block, self.block // 2, 2, groups, width)
                low, high = pairs[:, :, 0], pairs[:, :, 1]
            paired = _pair_bytes(low, high).view(full // self.block, self.block // 2, k)
            parts.append(paired.transpose(1, 2).reshape(-1))
        if n > full:
            pairs = qs[full:].view((n - full) // 2, 2, groups, width)
            parts.append(_pair_bytes(pairs[:, 0], pairs[:, 1]).view((n - full) // 2, k).t().reshape(-1))
        return (torch.cat(parts) if len(parts) > 1 else parts[0]).view(n, k // 2)

    def rows(self, packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
        """The codes of rows `ids` (int64 [R]) of a packed [N, K / 2] weight -> uint8 [R, K]."""
        n = packed.shape[0]
        full = n // self.block * self.block
        half = self.block // 2
        ids = ids.reshape(-1)
        in_full = ids < full
        block = torch.where(in_full, ids // self.block, full // self.block)
        offset = torch.where(in_full, ids % self.block, ids - full)
        width = torch.where(in_full, torch.full_like(ids, half), torch.full_like(ids, (n - full) // 2))
        if self.split:
            column = torch.where(in_full, offset % half, offset // 2)
            high = torch.where(in_full, offset >= half, offset % 2 == 1)
        else:
            column, high = offset // 2, offset % 2 == 1
        start = block * (k * half) + column  # byte of column k = 0
        index = start[:, None] + torch.arange(k, device=ids.device)[None, :] * width[:, None]
        data = packed.reshape(-1)[index]
        return torch.where(high[:, None], data >> 4, data & 0xF)


def _pair_bytes(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Bytes of (low row's code | high row's code << 4) for every column, from two rows' GGUF nibble bytes [..., G, W]:
    [..., G, 2, W] (columns i, then W + i, of each group)."""
    first = (low & 0x0F) | (high << 4)
    second = (low >> 4) | (high & 0xF0)
    return torch.stack((first, second), dim=-2)


CANDIDATES = (Layout(64, True), Layout(32, True), Layout(32, False), Layout(64, False))


@functools.cache
def layout() -> Layout | None:
    """The layout torch's packer uses here, or None when none of the known ones matches (a newer torch): then
    packing goes through torch's own packer and rows are not read back from a packing."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (176, 64), dtype=torch.uint8, generator=generator)  # full blocks and a short one
    try:
        expected = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), INNER_K_TILES)
    except (RuntimeError, AttributeError):  # the op is missing from this build
        return None
    for candidate in CANDIDATES:
        if candidate.pack(codes).shape == expected.shape and torch.equal(candidate.pack(codes), expected):
            return candidate
    log.info("torch's int4 packing here is not one of the known layouts; its own packer is used")
    return None


def pack(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [N, K] (N a multiple of 16, K of 32) -> torch's packed int4 weight for this CPU."""
    known = layout()
    if known is not None:
        return known.pack(codes.contiguous())
    return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), INNER_K_TILES)


def pack_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """GGUF's nibble bytes [N, G, W] (N a multiple of 16) -> torch's packed int4 weight for this CPU."""
    known = layout()
    if known is not None:
        return known.pack_nibbles(qs.contiguous())
    n, groups, width = qs.shape
    codes = torch.stack((qs & 0x0F, qs >> 4), dim=-2).view(n, groups * width * 2)
    return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), INNER_K_TILES)


def unpack_rows(packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor | None:
    """Rows' codes read back from a packing (uint8 [R, K]), or None where the layout is unknown."""
    known = layout()
    return None if known is None else known.rows(packed, ids, k)
