"""Memory estimate before loading: weight bytes for a dtype/quantization, KV bytes per token, free memory."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from engine.options import ResolvedOptions, element_size

# bitsandbytes 4-bit keeps one float32 absmax per block of 64 weights; int8 one float32 scale per row.
_NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model, read from its config alone."""

    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    parameters: int
    quantizable_parameters: int  # nn.Linear weights inside the decoder (not embeddings or the LM head)
    quantizable_rows: int


@dataclass(frozen=True)
class MemoryEstimate:
    shape: ModelShape
    dtype: str
    quantization: str
    weight_bytes: int
    kv_bytes_per_token: int

    def kv_tokens_for(self, kv_budget_bytes: int) -> int:
        return max(0, kv_budget_bytes // self.kv_bytes_per_token)

    def total_bytes(self, kv_budget_bytes: int) -> int:
        return self.weight_bytes + kv_budget_bytes


def model_shape(config) -> ModelShape:
    """Count parameters by building the model on the meta device (no weight is allocated)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    with init_empty_weights(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    # from_config leaves tied embeddings untied on the meta device (and tying inside the context is undone)
    model.tie_weights()
    parameters = sum(p.numel() for p in model.parameters())
    output = model.get_output_embeddings()
    quantizable = rows = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not output:
            quantizable += module.weight.numel()
            rows += module.out_features
    return ModelShape(
        architecture=(config.architectures or [type(model).__name__])[0],
        num_layers=text.num_hidden_layers,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        context_length=getattr(text, "max_position_embeddings", 0) or 0,
        parameters=parameters,
        quantizable_parameters=quantizable,
        quantizable_rows=rows,
    )


def estimate(shape: ModelShape, options: ResolvedOptions) -> MemoryEstimate:
    elem = element_size(options.dtype)
    plain = shape.parameters - shape.quantizable_parameters
    if options.quantization == "int8":
        weights = plain * elem + shape.quantizable_parameters + shape.quantizable_rows * 4
    elif options.quantization in ("nf4", "fp4"):
        weights = plain * elem + int(shape.quantizable_parameters * _NF4_BYTES_PER_WEIGHT)
    else:
        weights = shape.parameters * elem
    kv_per_token = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * elem
    return MemoryEstimate(
        shape=shape,
        dtype=options.dtype_name,
        quantization=options.quantization,
        weight_bytes=int(weights),
        kv_bytes_per_token=kv_per_token,
    )


def free_memory_bytes(device: str) -> int:
    """Memory available for weights and KV cache on the device (RAM for cpu and mps)."""
    if device == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def format_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
