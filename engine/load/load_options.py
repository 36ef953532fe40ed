"""LoadOptions: how a user asks for a model to be loaded (dtype, quantization, device), torch-free so that the
window's model choice and the CLI name it without importing torch; options.py checks it against this machine."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8", "int4", "nf4", "fp4")
DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True)
class LoadOptions:
    dtype: str = "auto"
    quantization: str = "none"
    device: str = "auto"
