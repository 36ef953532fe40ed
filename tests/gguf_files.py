"""Tiny GGUF files for tests, written with the gguf package: realistic zero-centred blocks of every type the loader
maps (the package quantizes Q4_0/Q4_1/Q5_x/Q8_0 itself; K-quant and other blocks are built here from random codes with
finite float16 scales), and whole tiny Llama/Qwen2 models with a byte-level BPE tokenizer in the metadata."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
QUANTIZABLE = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16, Q.BF16, Q.F32}


def _half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def _k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and minimums per block -> Q4_K/Q5_K's 12 bytes (the inverse of the decoders' unpacking)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def blocks(kind: GGMLQuantizationType, rows: int, columns: int, rng: np.random.Generator, scale: float = 0.02):
    """uint8 [rows, bytes] of `kind` holding realistic weights: centred on zero, about `scale` in size."""
    if kind in QUANTIZABLE:
        import gguf

        values = (rng.standard_normal((rows, columns)) * scale).astype(np.float32)
        return values if kind == Q.F32 else gguf.quants.quantize(values, kind)
    block, size = GGML_QUANT_SIZES[kind]
    count = rows * columns // block
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    if kind in (Q.Q4_K, Q.Q5_K):
        levels = 15 if kind == Q.Q4_K else 31
        sc = rng.integers(24, 64, (count, 8), dtype=np.uint8)
        d = np.full(count, scale / 5, dtype=np.float32) / 48
        dmin = d * (levels + 1) / 2 * 1.02
        # w = d * sc * q - dmin * m centred: dmin * m ~ d * sc * levels / 2
        mn = np.clip(np.round(sc * levels / 2 * d[:, None] / dmin[:, None]), 0, 63).astype(np.uint8)
        raw[:, 0:2], raw[:, 2:4], raw[:, 4:16] = _half(d), _half(dmin), _k_scales(sc, mn)
    elif kind == Q.Q6_K:  # q - 32 is already centred; positive int8 scales
        raw[:, 192:208] = rng.integers(16, 64, (count, 16), dtype=np.uint8)
        raw[:, 208:210] = _half(np.full(count, scale / 40 / 32, dtype=np.float32))
    elif kind == Q.Q2_K:
        raw[:, 80:82], raw[:, 82:84] = _half(np.full(count, scale / 20)), _half(np.full(count, scale / 40))
    elif kind == Q.Q3_K:
        raw[:, 108:110] = _half(np.full(count, scale / 40, dtype=np.float32))
    elif kind == Q.Q8_1:  # an intermediate type of llama.cpp's: valid bytes, but nothing reads it from a file
        raw[:, 0:2], raw[:, 2:4] = _half(np.full(count, scale / 100)), _half(np.zeros(count))
    elif kind in (Q.IQ4_NL,):
        raw[:, 0:2] = _half(np.full(count, scale / 100, dtype=np.float32))
    else:
        raise ValueError(f"no block builder for {kind.name}")
    return raw.reshape(rows, -1)


def dequantized(raw: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """The gguf package's own float32 values of `raw`: the reference."""
    import gguf

    return raw.astype(np.float32) if kind == Q.F32 else gguf.quants.dequantize(raw, kind)


def tokenizer_metadata(writer, tokenizer_folder: Path) -> None:
    """A byte-level BPE tokenizer (tokenizer.json of a transformers folder) as llama.cpp's "gpt2" metadata."""
    data = json.loads((tokenizer_folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    special = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    tokens = [None] * (max([*vocab.values(), *special.values()]) + 1)
    for token, index in [*vocab.items(), *special.items()]:
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    config = json.loads((tokenizer_folder / "tokenizer_config.json").read_text())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special[config["bos_token"]])
    writer.add_eos_token_id(special[config["eos_token"]])
    writer.add_pad_token_id(special[config["pad_token"]])
    template = tokenizer_folder / "chat_template.jinja"
    if template.exists():
        writer.add_chat_template(template.read_text())


def write_tiny_model(
    path: Path,
    tokenizer_folder: Path,
    kind_of: Callable[[str], GGMLQuantizationType],
    arch: str = "llama",
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    tied: bool = True,
    seed: int = 0,
    truncate_to: int | None = None,
    biases_first: bool = False,
) -> Path:
    """A tiny decoder in llama.cpp's names: kind_of(gguf tensor name) gives each matrix's type (1-D tensors are F32).
    Qwen2 files get q/k/v biases, after their layer's weights or (biases_first) before them, as converters that
    write tensors in name order do. Rows of llama's q and k are written as llama.cpp permutes them."""
    import gguf

    rng = np.random.default_rng(seed)
    vocab = json.loads((tokenizer_folder / "tokenizer.json").read_text())
    size = max([*vocab["model"]["vocab"].values(), *(t["id"] for t in vocab.get("added_tokens", []))]) + 1
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tokenizer_metadata(writer, tokenizer_folder)
    shapes = {"token_embd.weight": (size, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        shapes["output.weight"] = (size, hidden)
    for i in range(layers):
        p = f"blk.{i}."
        if arch == "qwen2" and biases_first:
            for name, rows in (("attn_q", heads), ("attn_k", kv_heads), ("attn_v", kv_heads)):
                shapes[f"{p}{name}.bias"] = (rows * head_dim,)
        shapes.update({
            p + "attn_norm.weight": (hidden,), p + "ffn_norm.weight": (hidden,),
            p + "attn_q.weight": (heads * head_dim, hidden), p + "attn_k.weight": (kv_heads * head_dim, hidden),
            p + "attn_v.weight": (kv_heads * head_dim, hidden), p + "attn_output.weight": (hidden, heads * head_dim),
            p + "ffn_gate.weight": (intermediate, hidden), p + "ffn_up.weight": (intermediate, hidden),
            p + "ffn_down.weight": (hidden, intermediate),
        })  # fmt: skip
        if arch == "qwen2":
            for name, rows in (("attn_q", heads), ("attn_k", kv_heads), ("attn_v", kv_heads)):
                shapes[f"{p}{name}.bias"] = (rows * head_dim,)
    for name, shape in shapes.items():
        if len(shape) == 1:
            values = 1 + rng.standard_normal(shape).astype(np.float32) * 0.1 if "norm" in name else None
            values = values if values is not None else rng.standard_normal(shape).astype(np.float32) * 0.02
            writer.add_tensor(name, values)
            continue
        kind = kind_of(name)
        scale = 0.5 if name == "token_embd.weight" else 0.08
        data = blocks(kind, *shape, rng, scale=scale)
        if kind == Q.F32:
            writer.add_tensor(name, data)
        elif kind in (Q.F16,):
            writer.add_tensor(name, data.view(np.float16).reshape(shape))
        else:
            writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if truncate_to is not None:
        with path.open("r+b") as handle:
            handle.truncate(truncate_to)
    return path
