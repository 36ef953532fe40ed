"""Random-weight models with the shapes of real ones (speed does not depend on the values): a Hugging Face folder
with the same weights as a Q4_1 GGUF file (the engine, transformers and llama.cpp run the same model), or one GGUF
file of random valid blocks in llama.cpp's Q4_K_M mix (every system reads the same file, as users run them).

Tensors are generated and written one at a time (never a whole model in memory), numpy and gguf only."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.bench.gguf_blocks import random_rows, row_bytes
from engine.bench.gguf_mix import MIXES, tensor_type
from engine.bench.synthetic_gguf import add_tensor_info, gguf_name, start_writer, write_gguf
from engine.errors import InvalidRequestError
from engine.load.model_source import embedded_gguf_path
from engine.paths import cache_dir

VOCAB = 49152  # SmolLM2's tokenizer, copied in: prompts tokenize as they do for the embedded model
FORMAT = 1  # bump when what is written changes, so cached models are rewritten
MIX_FORMAT = 1  # the same, for the single-file GGUF models


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder: QKV biases, grouped-query attention, tied embeddings unless the real model has an output
    matrix of its own."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    real: str  # the real model whose shape this is
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    s.name: s
    for s in (
        Shape("qwen2-0.5b", 896, 24, 14, 2, 4864, "Qwen2.5-0.5B (vocabulary 49152, so 0.40B parameters)"),
        Shape("qwen2-1.5b", 1536, 28, 12, 2, 8960, "Qwen2.5-1.5B (vocabulary 49152, so 1.39B parameters)"),
        Shape("qwen2-3b", 2048, 36, 16, 2, 11008, "Qwen2.5-3B (vocabulary 49152, so 2.86B parameters)"),
        # Qwen2.5-7B rather than Llama-3-8B: the same architecture and writer as the other shapes, and the 7B most
        # often run as Q4_K_M; like the real one it has an output matrix of its own (no tied embeddings)
        Shape("qwen2-7b", 3584, 28, 28, 4, 18944, "Qwen2.5-7B (vocabulary 49152, so 6.87B parameters)", tied=False),
        Shape("qwen2-tiny", 256, 2, 4, 2, 512, "none: a few MB, for tests"),
    )
}


def config(shape: Shape) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": VOCAB,
        "max_position_embeddings": 32768,
        "rope_theta": 1e6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": shape.tied,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.layers,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "dtype": "bfloat16",
    }


def tensor_specs(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor in file order (tied embeddings: no lm_head)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    specs: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (shape.intermediate, h)),
            (p + "mlp.up_proj.weight", (shape.intermediate, h)),
            (p + "mlp.down_proj.weight", (h, shape.intermediate)),
        ]
    specs.append(("model.norm.weight", (h,)))
    if not shape.tied:
        specs.append(("lm_head.weight", (VOCAB, h)))
    return specs


def tensor(name: str, dims: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """float32; the same name and seed give the same values (each tensor has its own generator)."""
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return np.ones(dims, np.float32)
    return _generator(name, seed).standard_normal(dims, dtype=np.float32) * np.float32(0.02)


def _generator(name: str, seed: int = 0) -> np.random.Generator:
    """Each tensor has its own generator, so the same name and seed give the same values in every writer."""
    return np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little"))


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = x.astype(np.float32, copy=False).view(np.uint32)
    return ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)


def write_folder(shape: Shape, folder: Path) -> None:
    """config.json, model.safetensors (bfloat16, streamed: header first, then tensor after tensor), tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    specs = tensor_specs(shape)
    header: dict = {}
    offset = 0
    for name, dims in specs:
        size = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with (folder / "model.safetensors").open("wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for name, dims in specs:
            to_bfloat16_bits(tensor(name, dims)).tofile(out)
    (folder / "config.json").write_text(json.dumps(config(shape), indent=1))
    generation = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    write_tokenizer(folder)


def write_tokenizer(folder: Path) -> None:
    """The embedded model's tokenizer and chat template, read from its GGUF metadata, saved into a folder."""
    from engine.load.gguf_header import read_header
    from engine.load.gguf_metadata import read_tokenizer

    read_tokenizer(read_header(embedded_gguf_path())).save_pretrained(folder)


@dataclass(frozen=True)
class SyntheticModel:
    shape: Shape
    folder: Path  # the Hugging Face folder (bfloat16 weights)
    gguf: Path  # the same weights as Q4_1, the embedded model's format

    @property
    def parameters(self) -> int:
        return sum(int(np.prod(dims)) for _, dims in tensor_specs(self.shape))


def synthetic_model(name: str, root: Path | None = None, progress=None) -> SyntheticModel:
    """The model called `name`, written under the cache the first time (seconds for 0.5B, about a minute for 1.5B)."""
    shape = SHAPES[name]
    base = (root or cache_dir() / "synthetic") / f"{name}-v{FORMAT}"
    model = SyntheticModel(shape, base / "hf", base / f"{name}-q4_1.gguf")
    done = base / "written.json"
    if not done.exists():
        if progress:
            progress(f"writing the random-weight {name} model ({shape.real}) as a folder and a GGUF file")
        shutil.rmtree(base, ignore_errors=True)
        write_folder(shape, model.folder)
        write_gguf(model.folder, model.gguf, embedded_gguf_path())
        done.write_text(json.dumps({"shape": name, "format": FORMAT, "parameters": model.parameters}))
    return model


def mix_types(shape: Shape, mix: str) -> dict[str, object]:
    """GGUF tensor name -> GGML type, for every tensor of the shape."""
    return {
        gguf_name(name): tensor_type(mix, gguf_name(name), dims, shape.layers, shape.tied)
        for name, dims in tensor_specs(shape)
    }


def gguf_bytes(shape: Shape, mix: str) -> int:
    """The tensor data of the shape in the mix (the file is this plus a few MB of header and tokenizer)."""
    import gguf

    types = mix_types(shape, mix)
    total = 0
    for name, dims in tensor_specs(shape):
        qtype = types[gguf_name(name)]
        rows = int(np.prod(dims[:-1]))
        total += rows * (dims[-1] * 4 if qtype == gguf.GGMLQuantizationType.F32 else row_bytes(qtype, dims[-1]))
    return total


def write_mixed_gguf(
    shape: Shape, out: Path, mix: str, progress: Callable[[str], None] | None = None, label: str | None = None
) -> None:
    """One GGUF file of random valid blocks in the mix, tensor after tensor (a tensor's packed bytes are the most
    held at once: 144 MB for the 7B's output matrix). Norms are ones, biases small random floats."""
    import gguf

    types = mix_types(shape, mix)
    specs = tensor_specs(shape)
    writer = start_writer(out, config(shape), MIXES[mix], embedded_gguf_path())
    for name, dims in specs:
        add_tensor_info(writer, gguf_name(name), dims, types[gguf_name(name)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    reported = 0
    for index, (name, dims) in enumerate(specs):
        qtype = types[gguf_name(name)]
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.write_tensor_data(tensor(name, dims))
        else:
            writer.write_tensor_data(random_rows(qtype, int(np.prod(dims[:-1])), dims[-1], _generator(name)))
        share = (index + 1) * 10 // len(specs)
        if progress and share > reported:
            reported = share
            progress(f"writing {label or out.name}: {share * 10} %")
    writer.close()


def synthetic_gguf(
    name: str, mix: str = "q4_k_m", root: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The model called `name` as one GGUF file in the mix, written under the cache the first time (seconds for
    0.5B, a minute for 3B, minutes for 7B); a file half-written by an interrupted run is never taken for done."""
    if mix not in MIXES:
        raise InvalidRequestError(f"unknown GGUF mix {mix!r}; choose from {', '.join(MIXES)}")
    shape = SHAPES[name]
    base = root or cache_dir() / "synthetic"
    path = base / f"{name}-{mix}-v{MIX_FORMAT}.gguf"
    if path.exists():
        return path
    base.mkdir(parents=True, exist_ok=True)
    needed = gguf_bytes(shape, mix) + (64 << 20)
    free = shutil.disk_usage(base).free
    if free < needed:
        raise InvalidRequestError(
            f"writing the {name} model needs {needed / 1e9:.1f} GB of disk under {base}; {free / 1e9:.1f} GB are free"
        )
    if progress:
        size = gguf_bytes(shape, mix) / 1e9
        progress(f"writing the random-weight {name} model ({shape.real}) as {mix.upper()} GGUF ({size:.2f} GB)")
    partial = path.with_name(path.name + ".partial")
    try:
        write_mixed_gguf(shape, partial, mix, progress, label=path.name)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
