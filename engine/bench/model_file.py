"""What the server benchmark reads from a model without loading its weights: the tokenizer (workloads are token
ids), the file's size and GGUF tensor types, and the llama.cpp context that holds the same KV bytes as the studio."""

from __future__ import annotations

import collections
import functools
import warnings
from pathlib import Path

from engine.load.kv_policy import DEFAULT_TOKENS
from engine.load.model_source import resolve_model_spec

LLAMA_CTX_STEP = 256  # llama.cpp pads its context to this


def bench_tokenizer(spec: str | None):
    """The model's tokenizer: from a GGUF file's metadata (transformers reads it; seconds for a large vocabulary),
    a folder, or the hub."""
    from transformers import AutoTokenizer

    source = resolve_model_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if source.is_gguf:
            assert source.path is not None
            return AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
        return AutoTokenizer.from_pretrained(str(source.path or source.spec))


def gguf_path(spec: str | None) -> Path | None:
    source = resolve_model_spec(spec)
    return source.path if source.is_gguf else None


def model_bytes(spec: str | None) -> int | None:
    """The file's size (a folder's weight files together); None for a hub id not downloaded here."""
    path = resolve_model_spec(spec).path
    if path is None:
        return None
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors")) or None


def read_through(spec: str | None, chunk: int = 16 << 20) -> int:
    """Read the model's files once, so the page cache holds them before any server starts: the first system of the
    first round would otherwise pay the disk for every later one. Returns the bytes read (0 where they are not
    here)."""
    path = resolve_model_spec(spec).path
    if path is None:
        return 0
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    done = 0
    buffer = bytearray(chunk)
    for file in files:
        with open(file, "rb", buffering=0) as stream:
            while count := stream.readinto(buffer):
                done += count
    return done


@functools.cache
def _gguf_header(path: str, modified_ns: int) -> tuple[dict[str, object], dict[str, int]]:
    """The scalar metadata fields and the count of tensors per GGML type, read once per file and process (gguf's
    reader takes seconds over a large vocabulary's strings)."""
    import gguf

    reader = gguf.GGUFReader(path)
    scalars: dict[str, object] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            scalars[key] = field.contents()
    return scalars, dict(collections.Counter(t.tensor_type.name for t in reader.tensors))


def _header(path: Path) -> tuple[dict[str, object], dict[str, int]]:
    return _gguf_header(str(path), path.stat().st_mtime_ns)


def gguf_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds."""
    return _header(path)[1]


def llama_kv_bytes_per_token(path: Path) -> int:
    """K and V of every layer in float16, llama.cpp's default KV type, from the GGUF header."""
    fields = _header(path)[0]
    arch = fields["general.architecture"]

    def number(key: str) -> int | None:
        value = fields.get(f"{arch}.{key}")
        return None if value is None else int(value)

    layers = number("block_count") or 0
    heads = number("attention.head_count") or 1
    kv_heads = number("attention.head_count_kv") or heads
    head_dim = (number("embedding_length") or 0) // heads
    key = number("attention.key_length") or head_dim
    value = number("attention.value_length") or head_dim
    return layers * kv_heads * (key + value) * 2


def equal_kv_context(path: Path, kv_bytes: int | None, needed_tokens: int) -> tuple[int, int]:
    """llama.cpp's n_ctx (all slots together: one unified buffer) holding about `kv_bytes` of KV, as the studio's
    budget does, or, for the studio's automatic budget (None), its 16,384 tokens; never fewer tokens than the
    workloads need; and the bytes that context takes."""
    per_token = llama_kv_bytes_per_token(path)
    tokens = DEFAULT_TOKENS if kv_bytes is None else kv_bytes // per_token // LLAMA_CTX_STEP * LLAMA_CTX_STEP
    needed = -(-needed_tokens // LLAMA_CTX_STEP) * LLAMA_CTX_STEP
    ctx = max(tokens, needed)
    return ctx, ctx * per_token
