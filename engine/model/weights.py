"""What a model's weights are as stored: each linear's format (float32, bfloat16, float16, int8, int4), the dtype its
activations flow in, the float weight behind a weight module. Everything that used to read
`next(model.parameters()).dtype` or `linear.weight` asks here, so models held as stored work everywhere."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.quantized import WEIGHT_MODULES, weight_format

FLOAT32, BFLOAT16, FLOAT16, INT8, INT4 = "float32", "bfloat16", "float16", "int8", "int4"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def is_linear(module: object) -> bool:
    """A linear the engine can run: a float nn.Linear or one of the engine's weight modules."""
    if type(module) is nn.Linear:
        return module.weight.dtype in FLOAT_DTYPES
    return isinstance(module, WEIGHT_MODULES)


def linear_format(module: nn.Module) -> str:
    """The format a linear's weight is held in."""
    if not is_linear(module):
        raise TypeError(f"{type(module).__name__} is not a linear the engine knows")
    return weight_format(module)


def weight_module(module: object) -> bool:
    """One of the engine's weight modules (a file's tensors held as stored), not a plain nn.Linear."""
    return isinstance(module, WEIGHT_MODULES)


def device_of(model: nn.Module) -> torch.device:
    for tensor in _tensors(model):
        return tensor.device
    return torch.device("cpu")


def activation_dtype(model: nn.Module) -> torch.dtype:
    """The dtype hidden states flow in, as the model's norms hold it: float32 wherever a model is held as stored;
    a model cast whole to 16 bits computes in that dtype in transformers' own forward."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point:
        return weight.dtype
    floats = [t.dtype for t in _tensors(model) if t.dtype.is_floating_point]
    return floats[0] if floats else torch.float32


def formats_of(model: nn.Module) -> set[str]:
    """The formats of the model's linears (the decoder's and the LM head)."""
    return {linear_format(m) for m in model.modules() if is_linear(m)}


def dequantize(module: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [out, in] a linear multiplies with, in `dtype` (a copy for weight modules; a float weight as it
    is, cast if asked)."""
    if type(module) is nn.Linear:
        return module.weight.detach().to(dtype)
    if weight_module(module):
        return module.dequantize().to(dtype)
    raise TypeError(f"{type(module).__name__} has no weight the engine can read")


def _tensors(model: nn.Module):
    yield from model.parameters()
    yield from model.buffers()
