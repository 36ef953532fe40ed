"""The engine's weight modules on torch's own CPU kernels, drop-in for nn.Linear / nn.Embedding in a model whose
activations are float32: int4 in groups of 32 along the input (GGUF's Q4_0/Q4_1/Q4_K map onto it code for code),
int8 with one scale per output row, 16-bit dense, and an embedding that keeps its rows in one of those formats.
Inputs are cast to bfloat16 for the kernels (their float32 paths are 5-10x slower), outputs are float32."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import int4pack

INT4_GROUP = 32
INT4_TILES = int4pack.INNER_K_TILES
#: what the int4 kernel keeps its scales and zeros in: bfloat16, because the kernel takes them in the activations'
#: dtype and float32 activations run 5-10x slower there (measured at 1-16 rows on AVX-512; see the loader's notes)
SCALE_DTYPE = torch.bfloat16
DEQUANTIZE_ROWS = 4096
#: rows of a chunk packed on its own: whole blocks of torch's packing (32 or 64 rows, by CPU) land where they belong
CHUNK_ROW_MULTIPLE = 64


def scale_up(scale: torch.Tensor) -> torch.Tensor:
    """The smallest SCALE_DTYPE values >= scale (float32 again): codes computed against the scale the kernel will
    use never overflow their range, so a weight's error stays within half a step."""
    rounded = scale.to(SCALE_DTYPE)
    low = rounded.float() < scale
    rounded[low] = torch.nextafter(rounded[low], torch.full_like(rounded[low], float("inf")))
    return rounded.float()


def int4_groups_from_float(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes per group of INT4_GROUP inputs: (codes uint8 [N, K], scale, zero float32 [N, K/32],
    both exact in SCALE_DTYPE) with w ~= (code - 8) * scale + zero: at most about half a step off."""
    weight = weight.detach().float()
    n, k = weight.shape
    groups = weight.reshape(n, k // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = scale_up((high - low).clamp_min(1e-12) / 15)
    zero = (low + 8 * scale).to(SCALE_DTYPE).float()
    codes = ((groups - zero[..., None]) / scale[..., None] + 8).round_().clamp_(0, 15)
    return codes.to(torch.uint8).reshape(n, k), scale, zero


def int8_rows_from_float(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (q int8 [N, K], scale float32 [N], exact in SCALE_DTYPE) with w ~= q * scale;
    a weight's error is at most half a step: 1/254 of its row's largest magnitude (and 2^-7 of that more at most, the
    scale rounded up to bfloat16)."""
    weight = weight.detach().float()
    scale = scale_up(weight.abs().amax(dim=1).clamp_min(1e-12) / 127)
    return (weight / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8), scale


def _float_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().float().contiguous()


class Int8Linear(nn.Module):
    """Symmetric int8 per output channel: w = q * scale."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """From a float weight [out, in] (quantized here)."""
        super().__init__()
        _hold_int8(self, *int8_rows_from_float(weight), bias)

    @classmethod
    def from_rows(cls, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        """From already-quantized rows: q int8 [out, in], scale [out] (w = q * scale)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        _hold_int8(module, q, scale, bias)
        return module

    @property
    def format(self) -> str:
        return "int8"

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [R, in] of rows `rows` (all rows when None): the weights this module multiplies with."""
        q, scale = (self.q, self.scale) if rows is None else (self.q[rows], self.scale[rows])
        return q.float() * scale.float()[:, None]

    #: steps of at least this many rows multiply through the compiled step's bfloat16 tiles, where its load
    #: measured them faster than torch's kernel (engine/model/tiles.py; faster than _by_tiles too); 0: never
    tiles_from = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if 0 < self.tiles_from <= rows.shape[0]:
            out = int8_tiles_mm(rows, self.q, self.scale)
        elif rows.shape[0] >= UNPACK_FROM_ROWS and rows.device.type == "cpu":
            out = self._by_tiles(rows)
        else:
            out = torch._weight_int8pack_mm(rows, self.q, self.scale).float()
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def _by_tiles(self, rows: torch.Tensor) -> torch.Tensor:
        """rows @ (q * scale)^T as (rows @ q^T) * scale, q cast to bfloat16 (exact: |q| <= 127) a tile of
        UNPACK_TILE_ROWS output rows at a time and multiplied by oneDNN: torch's int8 kernel, like its int4 one,
        costs the same per row at any batch size (640 rows of a 2048x11008 weight: 273 vs 43 ms)."""
        tiles = [rows @ self.q[start : start + UNPACK_TILE_ROWS].to(torch.bfloat16).t()
                 for start in range(0, self.out_features, UNPACK_TILE_ROWS)]  # fmt: skip
        return torch.cat(tiles, dim=1).float() * self.scale.float()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int4Linear(nn.Module):
    """Asymmetric int4 in groups of INT4_GROUP input columns: w = (q - 8) * scale + zero (torch's convention). Rows
    are padded to a multiple of 16 for torch's kernel (the padding multiplies to zero and is cut off)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """From a float weight [out, in] (quantized here, min/max per group)."""
        super().__init__()
        _check_int4_shape(*weight.shape)
        codes, scale, zero = int4_groups_from_float(weight)
        _hold_int4(self, *codes.shape, [(codes, scale, zero)], bias)

    @classmethod
    def from_groups(
        cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Int4Linear:
        """From already-quantized groups (GGUF Q4_0/Q4_1/Q4_K, no requantizing): codes uint8 [out, in] in 0..15,
        scale and zero [out, in / 32], w = (code - 8) * scale + zero."""
        return cls.from_row_chunks(*codes.shape, [(codes, scale, zero)], bias)

    @classmethod
    def from_row_chunks(
        cls,
        out_features: int,
        in_features: int,
        chunks: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        bias: torch.Tensor | None = None,
    ) -> Int4Linear:
        """Like from_groups, from consecutive chunks of rows (each a multiple of CHUNK_ROW_MULTIPLE rows but the
        last), packed as they come: a 150k-row LM head never has all its codes in memory at once."""
        _check_int4_shape(out_features, in_features)
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        _hold_int4(module, out_features, in_features, chunks, bias)
        return module

    @classmethod
    def from_packed(
        cls,
        packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        out_features: int,
        in_features: int,
        bias: torch.Tensor | None = None,
    ) -> Int4Linear:
        """From a weight already in torch's packing for this CPU (rows padded to a multiple of 16) and its bfloat16
        scales_and_zeros [in / 32, padded rows, 2]: what the loader's C++ decoders make of a GGUF Q4 tensor."""
        _check_int4_shape(out_features, in_features)
        padded = out_features + (-out_features % int4pack.ROW_MULTIPLE)
        if packed.shape != (padded, in_features // 2) or scales_and_zeros.shape != (
            in_features // INT4_GROUP,
            padded,
            2,
        ):
            raise ValueError(f"a packing of {tuple(packed.shape)} does not hold {out_features}x{in_features} weights")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.out_features, module.in_features = out_features, in_features
        module.register_buffer("packed", packed)
        module.register_buffer("scales_and_zeros", scales_and_zeros.to(SCALE_DTYPE))
        module.register_buffer("bias", _float_bias(bias))
        return module

    tiles_from = 0  # as Int8Linear.tiles_from

    @property
    def format(self) -> str:
        return "int4"

    def codes(self, rows: torch.Tensor) -> torch.Tensor | None:
        """uint8 [R, in] codes of rows `rows` read back from the packing, or None where its layout is unknown."""
        return int4pack.unpack_rows(self.packed, rows, self.in_features)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [R, in] of rows `rows` (all when None): the weights this module multiplies with (its bfloat16
        scales and zeros included)."""
        if rows is None:  # a chunk of rows at a time: the read-back indexes cost 8 bytes a weight
            chunks = torch.arange(self.out_features).split(DEQUANTIZE_ROWS)
            return torch.cat([self.dequantize(chunk) for chunk in chunks])
        rows = rows.reshape(-1)
        codes = self.codes(rows)
        if codes is None:  # unknown packing: multiply unit vectors through the kernel (bfloat16-rounded result)
            eye = torch.eye(self.in_features, dtype=torch.bfloat16)
            full = int4_kernel_mm(eye, self.packed, self.scales_and_zeros)
            return full.float().t()[rows]
        parts = self.scales_and_zeros[:, rows].float()  # [groups, R, 2]
        scale, zero = parts[..., 0].t(), parts[..., 1].t()
        groups = (codes.float() - 8).view(len(rows), -1, INT4_GROUP)
        return (groups * scale[..., None] + zero[..., None]).view(len(rows), self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        # the kernel reads its scales as contiguous whatever their strides: the lean forward's fused modules leave the
        # model's own modules strided views of theirs (engine/model/stored.py)
        scales = self.scales_and_zeros.contiguous()
        if 0 < self.tiles_from <= rows.shape[0]:  # set only where the packing layout is known (tiles.py)
            out = int4_tiles_mm(rows, self.packed, scales)
        elif (unpack := self._unpacker(rows)) is not None:
            out = self._by_tiles(rows, scales, unpack).float()
        else:
            out = int4_kernel_mm(rows, self.packed, scales).float()
        if out.shape[-1] != self.out_features:
            out = out[:, : self.out_features]
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    @staticmethod
    def _unpacker(rows: torch.Tensor):
        """The loader's unpacker for a prompt's many rows on a CPU, else None (torch's kernel)."""
        return int4_unpacker() if rows.shape[0] >= UNPACK_FROM_ROWS and rows.device.type == "cpu" else None

    def _by_tiles(self, rows: torch.Tensor, scales: torch.Tensor, unpack) -> torch.Tensor:
        """rows @ W^T with W unpacked to bfloat16 a tile of UNPACK_TILE_ROWS output rows at a time (a few MiB,
        reused while hot) and multiplied by oneDNN: torch's int4 kernel costs the same per row however many rows
        share the weight, so a prompt's rows paid ~12x what a bfloat16 product costs (254 vs 22 ms, 640 rows of an
        11008x2048 weight); the tiles' unpacking is ~21 ms of that weight, repaid from about 100 rows."""
        padded = self.packed.shape[0]
        tiles = [
            rows @ unpack(self.packed, scales, start, min(UNPACK_TILE_ROWS, padded - start)).t()
            for start in range(0, padded, UNPACK_TILE_ROWS)
        ]
        return torch.cat(tiles, dim=1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# from this many rows a step multiplies int4/int8 weights as unpacked bfloat16 tiles: on 2 AVX-512 cores a 3B
# model's step of 88 rows took 5.1 s with the int4 kernel, its 256-row steps 6.5 s with tiles against ~12 s; 16
# rows (16 chats decoding) stay far cheaper with the kernels (0.8 s against the ~2.5 s the unpacking costs)
UNPACK_FROM_ROWS = 64
UNPACK_TILE_ROWS = 1024  # a whole number of packing blocks (32 or 64 rows)


@functools.cache
def int4_unpacker():
    """unpack(packed, scales_and_zeros, first_row, rows) -> bfloat16 rows of a packed weight, with the loader's C++
    decoders and this torch's packing layout; None where either is unknown (the int4 kernel then runs at any size)."""
    from engine.load import native  # the loader's decoders: built once per machine

    layout = int4pack.layout()
    if layout is None or not native.available():
        return None
    return functools.partial(_unpack, native.int4_unpack, layout.block, layout.split)


def _unpack(op, block: int, split: bool, packed: torch.Tensor, scales: torch.Tensor, first: int, rows: int):
    return op(packed, scales, block, split, first, rows)


def int4_kernel_mm(rows: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bfloat16 rows @ an int4 packing (contiguous scales_and_zeros) by torch's weight-only kernel: bfloat16 out."""
    return torch._weight_int4pack_mm_for_cpu(rows, packed, INT4_GROUP, scales)


def int4_tiles_mm(rows: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The same product through the compiled step's bfloat16 tiles (engine/model/csrc/decode_step.cpp; its library
    loaded, this torch's packing layout known): float32 [rows, padded out features]."""
    layout = int4pack.layout()
    return torch.ops.studio.int4_tiles_mm(rows, packed, scales, layout.block, layout.split, tiles_vnni())


def int8_tiles_mm(rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """bfloat16 rows @ (q * scale)^T through the compiled step's bfloat16 tiles: float32."""
    return torch.ops.studio.int8_tiles_mm(rows, q, scale, tiles_vnni())


@functools.cache
def tiles_vnni() -> bool:
    """brgemm here takes pairs of bfloat16 columns (AMX): the tiles are laid out so."""
    return bool(torch.ops.studio.tiles_vnni())


def _hold_int8(module: Int8Linear, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
    module.out_features, module.in_features = q.shape
    module.register_buffer("q", q.contiguous())
    module.register_buffer("scale", scale.to(SCALE_DTYPE).contiguous())
    module.register_buffer("bias", _float_bias(bias))


def _hold_int4(module: Int4Linear, n: int, k: int, chunks, bias: torch.Tensor | None) -> None:
    """Pack consecutive chunks of rows' codes (see Int4Linear.from_row_chunks) into the module's buffers."""
    module.out_features, module.in_features = n, k
    padded = n + (-n % int4pack.ROW_MULTIPLE)
    packed = torch.empty(padded, k // 2, dtype=torch.uint8)
    scales_and_zeros = torch.empty(k // INT4_GROUP, padded, 2, dtype=SCALE_DTYPE)
    row = 0
    for codes, scale, zero in chunks:
        rows = codes.shape[0]
        if row + rows == n and padded > n:  # code 8 with scale and zero 0: the padding rows are exact zeros
            codes = torch.cat([codes, torch.full((padded - n, k), 8, dtype=torch.uint8)])
            scale = torch.cat([scale, scale.new_zeros(padded - n, scale.shape[1])])
            zero = torch.cat([zero, zero.new_zeros(padded - n, zero.shape[1])])
        elif rows % CHUNK_ROW_MULTIPLE and row + rows != n:
            raise ValueError(f"a chunk of {rows} rows is not a multiple of {CHUNK_ROW_MULTIPLE}")
        end = row + codes.shape[0]
        packed[row:end] = int4pack.pack(codes.to(torch.uint8))
        scales_and_zeros[:, row:end, 0] = scale.t()
        scales_and_zeros[:, row:end, 1] = zero.t()
        row = end
    if row != padded:
        raise ValueError(f"the chunks held {row} rows, not {n}")
    module.register_buffer("packed", packed)
    module.register_buffer("scales_and_zeros", scales_and_zeros)
    module.register_buffer("bias", _float_bias(bias))


def _check_int4_shape(n: int, k: int) -> None:
    if k % INT4_GROUP:
        raise ValueError(f"int4 needs columns divisible by {INT4_GROUP}, not {n}x{k}")


class HalfLinear(nn.Module):
    """A 16-bit dense weight (bfloat16, or float16 on a GPU) in a float32 model: inputs cast to it, float32 out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.detach().to(dtype).contiguous())
        self.register_buffer("bias", _float_bias(bias))

    @property
    def format(self) -> str:
        return str(self.weight.dtype).removeprefix("torch.")

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        return (self.weight if rows is None else self.weight[rows]).float()

    #: steps of at most this many rows multiply by the compiled step's claimed dot products (0: never): set where a
    #: compiled step measured them faster (engine/model/dense_rows.py); a stored 16-bit LM head runs every decode row
    claimed_to = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.weight.dtype)
        if 0 < rows.shape[0] <= self.claimed_to and self.weight.dtype == torch.bfloat16:
            out = torch.ops.studio.dense_claimed_mm(rows, self.weight)  # float32 sums, not rounded to bfloat16
        else:
            out = F.linear(rows, self.weight).float()
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.format}"


WeightModule = Int8Linear | Int4Linear | HalfLinear
WEIGHT_MODULES = (Int8Linear, Int4Linear, HalfLinear)


class QuantizedEmbedding(nn.Module):
    """Token embeddings kept in a weight module's format (often the tied LM head itself, sharing its bytes): the rows
    of the ids asked for are dequantized on use to float32."""

    def __init__(self, rows: WeightModule, embed_scale: float | torch.Tensor | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = rows.out_features, rows.in_features
        # A module in a plain list: the tied LM head owns it (and moves it); it is not registered twice.
        self._rows = [rows]
        self.embed_scale = embed_scale  # models that scale their embeddings (Gemma) keep doing so

    @classmethod
    def from_float(cls, weight: torch.Tensor, fmt: str, embed_scale=None) -> QuantizedEmbedding:
        """An embedding of its own (untied), quantized here: fmt int8, int4 or bfloat16."""
        module = cls(make_weight_module(weight, None, fmt), embed_scale)
        module.owned = module.rows_module  # registered: it is this module's own storage
        return module

    @property
    def rows_module(self) -> WeightModule:
        return self._rows[0]

    @property
    def format(self) -> str:
        return self.rows_module.format

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = self.rows_module.dequantize(flat)
        if self.embed_scale is not None:
            rows = rows * self.embed_scale
        return rows.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.format}"


def make_weight_module(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> nn.Module:
    """A float32-in, float32-out module holding `weight` [out, in] in `fmt` (int8, int4, bfloat16, float16)."""
    if fmt == "int8":
        return Int8Linear(weight, bias)
    if fmt == "int4":
        return Int4Linear(weight, bias)
    if fmt in ("bfloat16", "float16"):
        return HalfLinear(weight, bias, getattr(torch, fmt))
    raise ValueError(f"unknown weight format {fmt!r}")


def weight_format(module: nn.Module) -> str:
    """The format a linear or embedding holds its weight in: int8, int4, bfloat16, float32..."""
    if isinstance(module, (*WEIGHT_MODULES, QuantizedEmbedding)):
        return module.format
    weight = getattr(module, "weight", None)
    return str(weight.dtype).removeprefix("torch.") if isinstance(weight, torch.Tensor) else type(module).__name__
