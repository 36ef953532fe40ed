"""Memory estimate before loading: weight bytes for a dtype/quantization, KV bytes per token, free memory."""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn

from engine.load.estimate import MemoryEstimate, ModelShape
from engine.load.options import ResolvedOptions, element_size
from engine.model.geometry import attention_geometry

# bitsandbytes 4-bit keeps one float32 absmax per block of 64 weights; int8 one float32 scale per row.
_NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64


def model_shape(config) -> ModelShape:
    """Count parameters by building the model on the meta device (no weight is allocated)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    geometry = attention_geometry(config)
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
        num_layers=geometry.num_layers,
        num_kv_heads=geometry.num_kv_heads,
        head_dim=geometry.head_dim,
        context_length=getattr(text, "max_position_embeddings", 0) or 0,
        parameters=parameters,
        quantizable_parameters=quantizable,
        quantizable_rows=rows,
        hidden_size=text.hidden_size,
        intermediate_size=getattr(text, "intermediate_size", 0) or 4 * text.hidden_size,
        num_heads=geometry.num_heads,
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
    if options.engine_quantized:
        weights = shape.parameters * elem  # loaded as they are; the engine makes the quantized copies
    kv_per_token = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * elem
    return MemoryEstimate(
        shape=shape,
        dtype=options.dtype_name,
        quantization=options.quantization,
        weight_bytes=int(weights),
        kv_bytes_per_token=kv_per_token,
        engine_copy_bytes=engine_copy_bytes(shape, options),
    )


def engine_copy_bytes(shape: ModelShape, options: ResolvedOptions) -> int:
    """An upper bound of the engine's copies on a CPU: prepacked float32 linears and LM head, bfloat16 copies of the
    decoder's linears under an automatic dtype, int8/int4 copies when asked for (each kept only where measured to be
    the fastest for some batch size, so usually less)."""
    if (
        options.device != "cpu"
        or options.dtype != torch.float32
        or not (options.quantization == "none" or options.engine_quantized)
    ):
        return 0
    linear, other = shape.quantizable_parameters, shape.parameters - shape.quantizable_parameters
    copies = 4 * (linear + other)  # prepacked float32 (the LM head is tied to the embeddings: about `other`)
    if options.dtype_auto or options.engine_quantized:
        copies += 2 * linear
    if options.quantization == "int8":
        copies += linear + 2 * shape.quantizable_rows
    elif options.quantization == "int4":
        copies += linear // 2 + linear // 32 * 4
    return int(copies)


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
