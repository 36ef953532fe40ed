"""A GGUF file's header read in one pass with `struct` (metadata with its value types, the tensor table, where the
data starts), and checked against the file's size. The gguf package's GGUFReader builds a numpy array per string of
the vocabulary: 10 s and more for a 49k-token file here; this takes a fraction of a second."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Container
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from engine.errors import ModelFormatError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
SMALL_ARRAY = 4096  # string arrays longer than this (vocabularies, merges) are kept as their length only


@dataclass(frozen=True)
class TensorEntry:
    name: str
    kind: GGMLQuantizationType
    shape: tuple[int, ...]  # torch order: [rows, columns] for a matrix
    offset: int  # from the start of the file
    nbytes: int

    @property
    def rows(self) -> int:
        return prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows


@dataclass
class GGUFHeader:
    path: Path
    version: int
    #: key -> value (numbers, strings; arrays as lists, long string arrays as their length)
    values: dict[str, object] = field(default_factory=dict)
    #: key -> GGUF value types ([type], or [ARRAY, element type])
    types: dict[str, list[int]] = field(default_factory=dict)
    tensors: list[TensorEntry] = field(default_factory=list)
    data_start: int = 0
    file_size: int = 0

    @property
    def architecture(self) -> str:
        return str(self.values.get("general.architecture", "unknown"))

    @property
    def file_type(self) -> str:
        """llama.cpp's name for the file's quantization mix (Q4_K_M, Q4_1...), or "?"."""
        code = self.values.get("general.file_type")
        try:
            name = LlamaFileType(int(code)).name  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return "?" if code is None else f"type {code}"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")

    def tensor(self, name: str) -> TensorEntry | None:
        return next((t for t in self.tensors if t.name == name), None)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def read_header(path: Path, whole: Container[str] = ()) -> GGUFHeader:
    """The header of `path`; ModelFormatError (one line) for a file that is not GGUF, is damaged or truncated.
    whole: keys whose string arrays are kept in full however long (a tokenizer's vocabulary and merges)."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < 24:
                raise ValueError("shorter than a GGUF header")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                header = _parse(data, path, size, whole)
    except ModelFormatError:
        raise
    except (ValueError, struct.error, UnicodeDecodeError, OverflowError, OSError, KeyError, MemoryError) as exc:
        raise ModelFormatError(
            f"{path.name} is not a readable GGUF file ({_first_line(exc)}); it may be truncated or not a GGUF "
            "model: download it again"
        ) from None
    end = max((t.offset + t.nbytes for t in header.tensors), default=header.data_start)
    if end > size:
        raise ModelFormatError(
            f"{path.name} is truncated: its tensors need {end:,} bytes but the file has {size:,}; download it again"
        )
    return header


def _parse(data: mmap.mmap, path: Path, size: int, whole: Container[str] = ()) -> GGUFHeader:
    if data[:4] != MAGIC:
        raise ValueError("no GGUF magic at the start")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", data, 4)
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version}, not one of {VERSIONS}")
    if tensor_count > 1_000_000 or kv_count > 1_000_000:
        raise ValueError("implausible tensor or key counts")
    header = GGUFHeader(path, version, file_size=size)
    pos = 24
    for _ in range(kv_count):
        key, pos = _string(data, pos)
        (kind,) = struct.unpack_from("<I", data, pos)
        value, types, pos = _value(data, pos + 4, kind, key in whole)
        header.values[key], header.types[key] = value, types
    entries = []
    for _ in range(tensor_count):
        name, pos = _string(data, pos)
        (dims,) = struct.unpack_from("<I", data, pos)
        if dims > 8:
            raise ValueError(f"tensor {name} has {dims} dimensions")
        shape = struct.unpack_from(f"<{dims}Q", data, pos + 4)
        kind, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * dims)
        pos += 4 + 8 * dims + 12
        try:
            known = GGMLQuantizationType(kind)
        except ValueError:
            raise ModelFormatError(
                f"{path.name} stores tensor {name} as ggml type {kind}, which this version of the studio does not "
                "know; convert the file to a common type (Q4_K_M, Q8_0) or update the studio"
            ) from None
        entries.append((name, known, tuple(reversed(shape)), offset))
    alignment = int(header.values.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment} is not a power of two")
    header.data_start = (pos + alignment - 1) // alignment * alignment
    for name, kind, shape, offset in entries:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        elements = prod(shape)
        if shape and shape[-1] % block:
            raise ValueError(f"tensor {name}'s rows of {shape[-1]} are not whole {kind.name} blocks")
        nbytes = elements // block * block_bytes
        header.tensors.append(TensorEntry(name, kind, shape, header.data_start + offset, nbytes))
    return header


def _string(data: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, pos)
    end = pos + 8 + length
    if end > len(data):
        raise ValueError("a string runs past the end of the file")
    return data[pos + 8 : end].decode("utf-8"), end


def _value(data: mmap.mmap, pos: int, kind: int, whole: bool = False) -> tuple[object, list[int], int]:
    if kind in _SCALARS:
        fmt = "<" + _SCALARS[kind]
        return struct.unpack_from(fmt, data, pos)[0], [kind], pos + struct.calcsize(fmt)
    if kind == STRING:
        text, pos = _string(data, pos)
        return text, [kind], pos
    if kind != ARRAY:
        raise ValueError(f"unknown metadata value type {kind}")
    element, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if element in _SCALARS:
        fmt = f"<{count}{_SCALARS[element]}"
        return list(struct.unpack_from(fmt, data, pos)), [kind, element], pos + struct.calcsize(fmt)
    if element != STRING:
        raise ValueError(f"metadata array of type {element}")
    if count > SMALL_ARRAY and not whole:  # walk it: only a tokenizer wants it
        for _ in range(count):
            (length,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + length
        return count, [kind, element], pos
    values = []
    for _ in range(count):
        text, pos = _string(data, pos)
        values.append(text)
    return values, [kind, element], pos


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
