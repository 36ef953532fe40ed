"""How a weight format changes decode speed on this machine, measured on a model's own layer shapes before it loads:
so the picker can say "int4: 2.5x faster decode than float32 here" or "nf4: 3x slower here" instead of promising."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from engine.load.estimate import ModelShape
from engine.model import formats

PROBE_PARAMETERS = 48_000_000  # enough layers that their weights stream from memory, as a real decode step's do


def _layer_weights(shape: ModelShape) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linears: fused qkv, o_proj, fused gate/up, down."""
    q = shape.num_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    hidden, inner = shape.hidden_size, shape.intermediate_size
    return [(q + 2 * kv, hidden), (hidden, q), (2 * inner, hidden), (hidden, inner)]


def _bitsandbytes(weight: torch.Tensor, kind: str) -> nn.Module:
    import bitsandbytes as bnb

    out_features, in_features = weight.shape
    if kind == "int8":
        module = bnb.nn.Linear8bitLt(in_features, out_features, bias=False, has_fp16_weights=False)
        module.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        module = bnb.nn.Linear4bit(in_features, out_features, bias=False, quant_type=kind, compute_dtype=torch.float32)
        module.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=kind)
    return module.to("cpu")


def _builder(path: str) -> Callable[[torch.Tensor], nn.Module]:
    if path == formats.FLOAT32:
        return lambda w: formats.FormattedLinear(w, None, formats.FLOAT32)
    if path.startswith("bitsandbytes "):
        kind = path.removeprefix("bitsandbytes ")
        return lambda w: _bitsandbytes(w, kind)
    return lambda w: formats.make_linear(w, None, path)


def decode_ms(shape: ModelShape, path: str, repeats: int = 5) -> float | None:
    """Milliseconds of one decode step's linears (one row) for the whole model in `path` (a format, or
    "bitsandbytes nf4"...), measured on enough random layers of its shapes, scaled to its layer count."""
    per_layer = sum(o * i for o, i in _layer_weights(shape))
    if not per_layer or not shape.num_layers:
        return None
    layers = min(shape.num_layers, max(1, math.ceil(PROBE_PARAMETERS / per_layer)))
    build = _builder(path)
    try:
        with torch.inference_mode():
            modules = [build(torch.randn(o, i) * 0.02) for _ in range(layers) for o, i in _layer_weights(shape)]
            inputs = {i: torch.randn(1, i) for _, i in _layer_weights(shape)}
            best = math.inf
            for _ in range(repeats + 2):  # two warm-ups: the first calls create oneDNN's primitives
                started = time.perf_counter()
                for module in modules:
                    module(inputs[module.in_features])
                best = min(best, time.perf_counter() - started)
    except Exception:  # the kernel is missing from this build or refuses these shapes
        return None
    return best * 1e3 * shape.num_layers / layers


def compare_note(shape: ModelShape, quantization: str, dtype_auto: bool) -> str:
    """One line for the picker: the chosen format's decode speed against float32, measured here (CPU only)."""
    if quantization in ("int8", "int4"):
        path = quantization
    elif quantization in ("nf4", "fp4") or quantization == "int8-bnb":
        path = f"bitsandbytes {quantization}"
    elif dtype_auto and formats.usable(formats.BFLOAT16, torch.device("cpu")):
        path = formats.BFLOAT16
    else:
        return ""
    baseline, chosen = decode_ms(shape, formats.FLOAT32), decode_ms(shape, path)
    if not baseline or not chosen:
        return f"{path}: not measurable on this machine"
    ratio = baseline / chosen
    how = f"{ratio:.1f}x faster" if ratio >= 1.05 else f"{1 / ratio:.1f}x slower" if ratio <= 0.95 else "as fast"
    return (
        f"decode with {path} weights: {how} than float32 here ({chosen:.3g} vs {baseline:.3g} ms of linears per "
        "token, measured on this model's layer shapes)"
    )
