"""Turn a float model's weights into the engine's weight modules in place, one tensor at a time (each float weight is
dropped as soon as its quantized module exists): `--quant int8|int4` on a safetensors folder, and tests."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.quantized import INT4_GROUP, QuantizedEmbedding, make_weight_module


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def fits(fmt: str, weight_shape: tuple[int, ...]) -> bool:
    """The format takes this weight: int4 needs whole groups of inputs."""
    return fmt != "int4" or weight_shape[-1] % INT4_GROUP == 0


def quantize_model(model: nn.Module, fmt: str, head_fmt: str | None = None, embedding: bool = True) -> None:
    """Every nn.Linear in `fmt` (int8, int4, bfloat16), the LM head in `head_fmt` (default: fmt), the token embedding
    sharing a tied head's bytes (or quantized on its own, int8, when untied); everything else float32."""
    head_fmt = head_fmt or fmt
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    with torch.no_grad():
        model.float()
        for name, module in list(model.named_modules()):
            if type(module) is not nn.Linear or module is head or not fits(fmt, module.weight.shape):
                continue
            set_module(model, name, make_weight_module(module.weight, module.bias, fmt))
        if head is not None and fits(head_fmt, head.weight.shape):
            new_head = make_weight_module(head.weight, getattr(head, "bias", None), head_fmt)
            model.set_output_embeddings(new_head)
            if tied and embedding:
                model.set_input_embeddings(QuantizedEmbedding(new_head, getattr(embed, "embed_scale", None)))
        if embedding and not tied and embed is not None:
            quantized = QuantizedEmbedding.from_float(embed.weight, "int8", getattr(embed, "embed_scale", None))
            model.set_input_embeddings(quantized)
    model.requires_grad_(False)
