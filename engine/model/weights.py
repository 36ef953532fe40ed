"""What a model's weights are as stored: each linear's format (float32, bfloat16, float16, int8, int4), the dtype its
activations flow in, the float weight behind a quantized module. Everything that used to read
`next(model.parameters()).dtype` or `linear.weight` asks here, so models held as stored work everywhere."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.quantized import INT4_GROUP, Int4Linear, Int8Linear

FLOAT32, BFLOAT16, FLOAT16, INT8, INT4 = "float32", "bfloat16", "float16", "int8", "int4"
FLOAT_FORMATS = {torch.float32: FLOAT32, torch.bfloat16: BFLOAT16, torch.float16: FLOAT16}
QUANTIZED_MODULES: dict[type, str] = {Int8Linear: INT8, Int4Linear: INT4}
_DEQUANTIZE_COLUMNS = 1024  # the identity block an int4 weight is multiplied by: 4 MiB of float32 at a time


def is_linear(module: object) -> bool:
    """A linear the engine can run: a float nn.Linear or one of the engine's quantized weight modules."""
    if type(module) is nn.Linear:
        return module.weight.dtype in FLOAT_FORMATS
    return type(module) in QUANTIZED_MODULES


def linear_format(module: nn.Module) -> str:
    """The format a linear's weight is stored in."""
    if type(module) is nn.Linear:
        return FLOAT_FORMATS[module.weight.dtype]
    if type(module) in QUANTIZED_MODULES:
        return QUANTIZED_MODULES[type(module)]
    raise TypeError(f"{type(module).__name__} is not a linear the engine knows")


def quantized(module: object) -> bool:
    return type(module) in QUANTIZED_MODULES


def device_of(model: nn.Module) -> torch.device:
    for tensor in _tensors(model):
        return tensor.device
    return torch.device("cpu")


def activation_dtype(model: nn.Module) -> torch.dtype:
    """The dtype hidden states flow in: float32 wherever the model is held as stored (quantized or 16-bit weights
    with float32 norms); a model cast whole to 16 bits computes in that dtype in transformers' own forward."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point:
        return weight.dtype
    floats = [t.dtype for t in _tensors(model) if t.dtype.is_floating_point]
    return floats[0] if floats else torch.float32


def formats_of(model: nn.Module) -> set[str]:
    """The formats of the model's linears (the decoder's and the LM head)."""
    return {linear_format(m) for m in model.modules() if is_linear(m)}


def describe(model: nn.Module) -> str:
    """'int4', or 'int4 + int8' for a file that stores some tensors in another format."""
    return " + ".join(sorted(formats_of(model))) or str(activation_dtype(model)).removeprefix("torch.")


def out_features(module: nn.Module) -> int:
    """Rows of a linear's weight (the vocabulary, for an LM head), whatever its format."""
    if hasattr(module, "out_features"):
        return int(module.out_features)
    return int(module.weight.shape[0])


def linear_bytes(module: nn.Module) -> int:
    """Bytes of a linear's weight as it is held."""
    if type(module) is nn.Linear:
        return module.weight.numel() * module.weight.element_size()
    return sum(t.numel() * t.element_size() for t in vars(module).values() if isinstance(t, torch.Tensor))


def dequantize(module: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [out, in] a linear multiplies by, in `dtype` (a copy for quantized modules; float weights are
    returned as they are, cast if asked)."""
    if type(module) is nn.Linear:
        return module.weight.detach().to(dtype)
    if isinstance(module, Int8Linear):
        return (module.q.float() * module.scale.float()[:, None]).to(dtype)
    if isinstance(module, Int4Linear):
        return _dequantize_int4(module).to(dtype)
    raise TypeError(f"{type(module).__name__} has no weight the engine can read")


def _dequantize_int4(module: Int4Linear) -> torch.Tensor:
    """torch has no int4 unpacking for CPU: multiply the weight by identity blocks (float32 input, so every output is
    one weight value times 1, exact), a block of columns at a time."""
    k, n = module.in_features, module.out_features
    weight = torch.empty(n, k)
    with torch.inference_mode():
        for start in range(0, k, _DEQUANTIZE_COLUMNS):
            width = min(_DEQUANTIZE_COLUMNS, k - start)
            eye = torch.zeros(width, k)
            eye[:, start : start + width] = torch.eye(width)
            rows = torch._weight_int4pack_mm_for_cpu(eye, module.packed, INT4_GROUP, module.scales_and_zeros.float())
            weight[:, start : start + width] = rows.float().t()
    return weight


def _tensors(model: nn.Module):
    yield from model.parameters()
    yield from model.buffers()
    for module in model.modules():
        if quantized(module):
            yield from (t for t in vars(module).values() if isinstance(t, torch.Tensor))
