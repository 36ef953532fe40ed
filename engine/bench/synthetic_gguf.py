"""Synthetic models as GGUF files (llama.cpp's names and layout, the tokenizer metadata of a reference GGUF file,
the embedded model's): the header every such file has, and a Hugging Face folder rewritten as Q4_1 tensor by
tensor."""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import numpy as np

GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = name.split(".", 3)
    return f"blk.{index}.{GGUF_NAMES[rest]}"


def read_safetensors(path: Path) -> tuple[dict, object]:
    """The header, and a reader of one tensor as float32 (memory-mapped: nothing is read until asked)."""
    with path.open("rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)

    def get(name: str) -> np.ndarray:
        entry = header[name]
        start, end = entry["data_offsets"]
        assert entry["dtype"] == "BF16", entry["dtype"]
        bits = data[start:end].view(np.uint16).reshape(entry["shape"])
        return (bits.astype(np.uint32) << 16).view(np.float32)

    return header, get


@functools.cache
def _tokenizer_fields(reference: str) -> list[tuple[str, object, object]]:
    """(key, value type, contents) of the reference file's tokenizer fields: read once per process, as parsing
    49152 tokens and their merges takes gguf's reader seconds."""
    import gguf

    fields = gguf.GGUFReader(reference).fields.items()
    return [(key, field.types[0], field.contents()) for key, field in fields if key.startswith("tokenizer.")]


def _copy_tokenizer(writer, reference: Path) -> None:
    import gguf

    kinds = gguf.GGUFValueType
    add = {
        kinds.STRING: writer.add_string,
        kinds.BOOL: writer.add_bool,
        kinds.UINT32: writer.add_uint32,
        kinds.INT32: writer.add_int32,
        kinds.FLOAT32: writer.add_float32,
        kinds.ARRAY: writer.add_array,
    }
    for key, kind, contents in _tokenizer_fields(str(reference)):
        add[kind](key, contents)


def start_writer(out: Path, cfg: dict, file_type, tokenizer_gguf: Path):
    """A GGUFWriter holding a Qwen2 model's metadata (no Q/K permutation, unlike llama's) and the tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(str(out), "qwen2")
    writer.add_name(out.stem)
    writer.add_file_type(file_type)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_freq_base(float(cfg["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_dimension_count(cfg["head_dim"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _copy_tokenizer(writer, tokenizer_gguf)
    return writer


def add_tensor_info(writer, name: str, dims: tuple[int, ...], qtype) -> None:
    """Describe one tensor (torch's dims order) before any data is written."""
    import gguf

    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
    else:
        raw = gguf.quants.quant_shape_to_byte_shape(dims, qtype)
        writer.add_tensor_info(name, raw, np.dtype(np.uint8), int(np.prod(raw)), raw_dtype=qtype)


def write_gguf(folder: Path, out: Path, tokenizer_gguf: Path) -> None:
    """The folder's weights as Q4_1 (matrices) and float32 (norms, biases)."""
    import gguf

    q4_1 = gguf.GGMLQuantizationType.Q4_1
    cfg = json.loads((folder / "config.json").read_text())
    header, get = read_safetensors(folder / "model.safetensors")
    writer = start_writer(out, cfg, gguf.LlamaFileType.MOSTLY_Q4_1, tokenizer_gguf)
    names = list(header)
    for name in names:  # first every tensor's description (sizes), then the data in the same order
        dims = tuple(header[name]["shape"])
        add_tensor_info(writer, gguf_name(name), dims, gguf.GGMLQuantizationType.F32 if len(dims) == 1 else q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name in names:
        values = np.ascontiguousarray(get(name))
        writer.write_tensor_data(values if values.ndim == 1 else gguf.quants.quantize(values, q4_1))
    writer.close()
