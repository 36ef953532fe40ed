"""Config and tokenizer from a GGUF file's metadata, by transformers' own GGUF readers (their architecture mappings,
tokenizer builders and chat template handling), fed from our one-pass header: transformers' metadata reader walks the
file through a numpy memmap, a slice object per string (0.4-0.5 s per read of a 150k vocabulary, and a load reads it
three times), and its config reader for some Llama-family files goes through the gguf package's GGUFReader (10-15 s
for a 49k vocabulary); during these calls both are given what our header parser read instead."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Container, Iterator
from pathlib import Path

from engine.errors import ModelFormatError
from engine.load.gguf_header import ARRAY, SMALL_ARRAY, STRING, GGUFHeader, read_header

_PATCH_LOCK = threading.Lock()


class _Field:
    __slots__ = ("data", "parts", "types")

    def __init__(self, value: object, types: list[int]) -> None:
        self.types = types
        if types[0] == ARRAY:
            # long arrays (the vocabulary, its merges and token types) are the tokenizer's, read by its own reader:
            # a config has no use for them, and turning 150k values into fields took a second per read
            items = value if isinstance(value, list) and len(value) <= SMALL_ARRAY else []
            self.parts = [item.encode() if types[1] == STRING else [item] for item in items]
        else:
            self.parts = [value.encode() if types[0] == STRING else [value]]  # type: ignore[union-attr]
        self.data = list(range(len(self.parts)))


class _Tensor:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class HeaderReader:
    """What transformers' metadata path reads of a gguf.GGUFReader (fields, tensor names), from our header."""

    def __init__(self, path, mode: str = "r") -> None:
        header = read_header(Path(path))
        self.fields = {key: _Field(header.values[key], header.types[key]) for key in header.values}
        self.tensors = [_Tensor(t.name) for t in header.tensors]


def transformers_metadata(path, string_arrays: Container[str] = ()) -> tuple[dict, tuple[str, ...]]:
    """What transformers' read_gguf_metadata returns (metadata, tensor names), from our parser: string arrays in full
    only for the keys in string_arrays, every other one as its length (as transformers' reader leaves them)."""
    header = read_header(Path(path), whole=string_arrays)
    return _as_transformers_reads(header, string_arrays), tuple(t.name for t in header.tensors)


def _as_transformers_reads(header: GGUFHeader, string_arrays: Container[str] = ()) -> dict:
    metadata: dict = {}
    for key, value in header.values.items():
        types = header.types[key]
        if types[0] == ARRAY and types[1] == STRING and key not in string_arrays and isinstance(value, list):
            value = len(value)
        metadata[key] = value
    return metadata


@contextlib.contextmanager
def _header_reader() -> Iterator[None]:
    """transformers' GGUF metadata readers (its own and the gguf package's) replaced by our header's, for this call."""
    import gguf
    from transformers.integrations import gguf as integration
    from transformers.integrations.gguf import reader

    with _PATCH_LOCK:
        originals = gguf.GGUFReader, reader.read_gguf_metadata, integration.read_gguf_metadata
        gguf.GGUFReader = HeaderReader
        reader.read_gguf_metadata = integration.read_gguf_metadata = transformers_metadata
        try:
            yield
        finally:
            gguf.GGUFReader, reader.read_gguf_metadata, integration.read_gguf_metadata = originals


def read_config(header: GGUFHeader):
    """The transformers config this file describes (tied embeddings when it has no output.weight)."""
    from transformers import AutoConfig
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS, get_gguf_config

    path = str(header.path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if header.architecture in GGUF_CONFIG_ARCHS:
                config = get_gguf_config(_as_transformers_reads(header), tuple(t.name for t in header.tensors))
            else:
                from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

                with _header_reader():
                    config = load_gguf_checkpoint(path, return_tensors=False)["config"]
            if not config.get("vocab_size"):  # the vocabulary's length, which the header reader keeps
                tokens = header.values.get("tokenizer.ggml.tokens")
                config["vocab_size"] = tokens if isinstance(tokens, int) else len(tokens or [])
            return AutoConfig.for_model(**config)
    except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
        raise ModelFormatError(
            f"transformers cannot build a model from {header.path.name} (architecture {header.architecture!r}): "
            f"{_first_line(exc)}"
        ) from None


def read_tokenizer(header: GGUFHeader):
    """The tokenizer (and chat template) stored in the file's metadata."""
    from transformers import AutoTokenizer

    try:
        with warnings.catch_warnings(), _header_reader():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(header.path.parent), gguf_file=header.path.name)
    except (ValueError, KeyError, TypeError, OSError, NotImplementedError) as exc:
        raise ModelFormatError(f"cannot read the tokenizer stored in {header.path.name}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
