"""What each stored tensor becomes in memory (the loader builds it, the estimate counts it): a GGUF block type and
the user's options in, the engine's format out (int4 codes as stored, int8 rows, 16-bit, float32) with how it got
there, and the bytes it will take."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch
from gguf import GGMLQuantizationType

from engine.errors import ModelFormatError, UnsupportedOptionError
from engine.load.gguf_blocks import FLOAT_TYPES, INT4_TYPES, bits_per_weight, can_decode
from engine.load.options import ResolvedOptions, gguf_quantization_problem
from engine.model.quantized import INT4_GROUP

Q = GGMLQuantizationType
INT4, INT8, BFLOAT16, FLOAT16, FLOAT32 = "int4", "int8", "bfloat16", "float16", "float32"
#: per-row int8 error bound of a requantized weight, relative to its row's largest magnitude (half a step of 127,
#: the bfloat16 scale rounded up by at most 2^-7)
INT8_ROW_ERROR = 0.5 / 127 * (1 + 2**-7)


class Mode(StrEnum):
    """AS_STORED: float32 norms, biases and activations; every linear an engine weight module in its own format.
    DENSE: a plain transformers model in one dtype (the float32 reference, bfloat16, a GPU's 16-bit)."""

    AS_STORED = "as stored"
    DENSE = "dense"


class Role(StrEnum):
    LINEAR = "linear"
    EMBEDDING = "embedding"
    HEAD = "head"
    OTHER = "other"  # norms, biases, anything 1-D: float32 (or the dense dtype)


@dataclass(frozen=True)
class TensorPlan:
    fmt: str  # int4, int8, bfloat16, float16, float32
    how: str  # "as stored", "requantized per row", ...

    def nbytes(self, rows: int, columns: int) -> int:
        """Bytes held for a [rows, columns] weight in this format (int4: rows padded to 16, bfloat16 scale and zero
        per group of 32; int8: a bfloat16 scale per row)."""
        if self.fmt == INT4:
            padded = rows + (-rows % 16)
            return padded * columns // 2 + padded * (columns // INT4_GROUP) * 4
        if self.fmt == INT8:
            return rows * columns + rows * 2
        return rows * columns * (4 if self.fmt == FLOAT32 else 2)


@dataclass(frozen=True)
class LoadPlan:
    mode: Mode
    dtype: torch.dtype  # the dense dtype, or float32 (the as-stored skeleton)
    small: bool = False  # dense float32 under `auto` because the model is small (SMALL_MODEL_FLOAT32_BYTES)

    def tensor(self, kind: GGMLQuantizationType, shape: tuple[int, ...], role: Role, quantization: str) -> TensorPlan:
        if not can_decode(kind):
            raise ModelFormatError(
                f"this file stores weights as {kind.name}, which the studio cannot read; use a Q4_K_M, Q4_0, Q5_K_M, "
                "Q6_K or Q8_0 file of the model"
            )
        if role is Role.OTHER or len(shape) < 2:
            return TensorPlan(_name(self.dtype), "as stored" if _stored_dtype(kind) == self.dtype else "converted")
        if self.mode is Mode.DENSE:
            how = "as stored" if _stored_dtype(kind) == self.dtype else f"dequantized from {kind.name}"
            return TensorPlan(_name(self.dtype), how)
        columns = shape[-1]
        groups_fit = columns % INT4_GROUP == 0
        if quantization == INT8:
            return TensorPlan(INT8, "as stored" if kind == Q.I8 else f"{kind.name} requantized per row")
        low_bit = kind not in FLOAT_TYPES and kind not in INT4_TYPES and bits_per_weight(kind) <= 4.6
        if quantization == INT4 or low_bit:
            if kind in INT4_TYPES:
                return TensorPlan(INT4, f"{kind.name} as stored")
            if groups_fit:
                return TensorPlan(INT4, f"{kind.name} requantized per group of 32")
            return TensorPlan(BFLOAT16, f"{kind.name} converted (rows not in groups of 32)")
        if kind in INT4_TYPES:
            return TensorPlan(INT4, f"{kind.name} as stored")
        if kind == Q.F32:
            return TensorPlan(FLOAT32, "F32 as stored")
        if kind in FLOAT_TYPES:
            return TensorPlan(BFLOAT16, f"{kind.name} as stored" if kind == Q.BF16 else "F16 converted")
        return TensorPlan(INT8, f"{kind.name} requantized per row")


@dataclass
class FormatTally:
    """What the loaded tensors became: (format, how) -> [tensors, bytes]."""

    entries: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def add(self, plan: TensorPlan, nbytes: int) -> None:
        entry = self.entries.setdefault((plan.fmt, plan.how), [0, 0])
        entry[0] += 1
        entry[1] += nbytes

    def describe(self) -> str:
        parts = []
        for (fmt, how), (count, _nbytes) in sorted(self.entries.items(), key=lambda kv: -kv[1][1]):
            note = ", error <= 0.4 % of the row's largest weight" if fmt == INT8 and "requantized" in how else ""
            parts.append(f"{fmt} ({how}{note}): {count} tensor{'s' if count != 1 else ''}")
        return "; ".join(parts)

    @property
    def formats(self) -> list[str]:
        return sorted({fmt for fmt, _how in self.entries})

    @property
    def formats_by_bytes(self) -> list[str]:
        """The formats, the one holding the most bytes first."""
        held: dict[str, int] = {}
        for (fmt, _how), (_count, nbytes) in self.entries.items():
            held[fmt] = held.get(fmt, 0) + nbytes
        return sorted(held, key=lambda fmt: -held[fmt])

    @property
    def nbytes(self) -> int:
        return sum(nbytes for _count, nbytes in self.entries.values())


def _stored_dtype(kind: GGMLQuantizationType) -> torch.dtype | None:
    return {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}.get(kind)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


#: under `auto`, a quantized file whose float32 weights take at most this much is dequantized in memory to float32:
#: the exact reference (a 4-bit rounding flips near-tied greedy tokens of the embedded 135M model), computed as fast
#: or faster than the 4-bit kernels at that size on the CPUs measured here, in memory no workstation misses
SMALL_MODEL_FLOAT32_BYTES = 1024**3


def plan_load(options: ResolvedOptions, matrix_kinds: set[GGMLQuantizationType], float32_bytes: int = 0) -> LoadPlan:
    """The model's mode from the options, the types of the file's matrices and its size in float32."""
    if options.quantization in ("nf4", "fp4") or (options.quantization == INT8 and options.device != "cpu"):
        raise UnsupportedOptionError(gguf_quantization_problem(options.quantization))
    if options.device != "cpu":
        return LoadPlan(Mode.DENSE, options.dtype)  # dequantized per tensor into the device's 16-bit format
    if options.quantization in (INT8, INT4):
        return LoadPlan(Mode.AS_STORED, torch.float32)
    if not options.dtype_auto:
        return LoadPlan(Mode.DENSE, options.dtype)  # float32: the exact reference; bfloat16 when asked for
    if (matrix_kinds and matrix_kinds <= {Q.F32}) or 0 < float32_bytes <= SMALL_MODEL_FLOAT32_BYTES:
        return LoadPlan(Mode.DENSE, torch.float32, small=0 < float32_bytes <= SMALL_MODEL_FLOAT32_BYTES)
    if matrix_kinds and matrix_kinds <= {Q.F16, Q.BF16}:
        return LoadPlan(Mode.DENSE, torch.bfloat16)  # a 16-bit file: the plain 16-bit model
    return LoadPlan(Mode.AS_STORED, torch.float32)
