"""Load options (dtype, quantization, device) and their validation against this machine."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from engine.errors import UnsupportedOptionError
from engine.load.load_options import DEVICES, DTYPES, QUANTIZATIONS, LoadOptions
from engine.load.model_source import SourceKind

# On a CPU, int8 and int4 are the engine's own weight-only kernels (torch's, per batch size where they are faster);
# elsewhere int8 is bitsandbytes'. nf4 and fp4 are bitsandbytes' 4-bit formats everywhere.
ENGINE_QUANTIZATIONS = ("int8", "int4")

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ResolvedOptions:
    """Options with every `auto` decided and every combination checked."""

    device: str
    dtype: torch.dtype
    quantization: str
    #: the user left the dtype to the studio: the engine may pick faster weight formats per batch size
    dtype_auto: bool = False

    @property
    def engine_quantized(self) -> bool:
        """Weights loaded in float, quantized by the engine's own kernels (not bitsandbytes)."""
        return self.quantization in ENGINE_QUANTIZATIONS and self.device == "cpu"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def available_devices() -> list[str]:
    devices = ["cpu"]
    if cuda_available():
        devices.insert(0, "cuda")
    if mps_available():
        devices.append("mps")
    return devices


def resolve_device(name: str) -> str:
    if name not in DEVICES:
        raise UnsupportedOptionError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    if name == "auto":
        return "cuda" if cuda_available() else "mps" if mps_available() else "cpu"
    if name == "cuda" and not cuda_available():
        raise UnsupportedOptionError(
            "device 'cuda' was asked for but this torch has no usable CUDA "
            f"(torch {torch.__version__}); use --device cpu or install a CUDA build of torch"
        )
    if name == "mps" and not mps_available():
        raise UnsupportedOptionError("device 'mps' needs Apple silicon with a Metal-enabled torch; use --device cpu")
    return name


def dtype_problem(dtype: str, device: str) -> str | None:
    """Why this dtype can't be used on this device, or None when it can."""
    if dtype not in DTYPES:
        return f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}"
    if dtype == "float16" and device == "cpu":
        return "float16 on the CPU is emulated and slow, and overflows in some models; use bfloat16 or float32"
    if dtype == "bfloat16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support; use float16"
    return None


GGUF_SOURCES = (SourceKind.GGUF_FILE, SourceKind.EMBEDDED)


def quantization_problem(quantization: str, device: str, source_kind: SourceKind | None = None) -> str | None:
    """Why this quantization can't be used on this device (for this kind of source, when given), or None when it
    can."""
    if quantization not in QUANTIZATIONS:
        return f"unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}"
    if quantization == "none":
        return None
    if source_kind in GGUF_SOURCES and (quantization in ("nf4", "fp4") or device != "cpu"):
        return gguf_quantization_problem(quantization)
    if quantization == "int4" and device != "cpu":
        return "int4 is the engine's CPU kernel; on a GPU choose nf4 (bitsandbytes) for 4-bit weights"
    if quantization in ENGINE_QUANTIZATIONS and device == "cpu":
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        return f"{quantization} needs the bitsandbytes package, which is not installed"
    if device == "mps":
        return f"bitsandbytes has no {quantization} backend for Apple's MPS; use --device cpu or --quant none"
    return None


def gguf_quantization_problem(quantization: str) -> str:
    return (
        f"{quantization} is bitsandbytes' format for safetensors models; a GGUF file loads as it is stored (or "
        "--quant int8/int4 on a CPU, --dtype float32 for the exact reference)"
    )


def auto_dtype(device: str) -> torch.dtype:
    # float32 on CPU: with AVX2 only, bfloat16 matmuls are slower at batch sizes above one.
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.float32


def resolve_options(options: LoadOptions) -> ResolvedOptions:
    """Decide every `auto` and refuse impossible combinations before anything is loaded."""
    device = resolve_device(options.device)
    if options.dtype == "auto":
        dtype = auto_dtype(device)
    else:
        problem = dtype_problem(options.dtype, device)
        if problem:
            raise UnsupportedOptionError(problem)
        dtype = _TORCH_DTYPES[options.dtype]
    problem = quantization_problem(options.quantization, device)
    if problem:
        raise UnsupportedOptionError(problem)
    if options.quantization != "none" and dtype == torch.float16 and device == "cpu":
        raise UnsupportedOptionError("quantized models on the CPU compute in float32 or bfloat16, not float16")
    return ResolvedOptions(device, dtype, options.quantization, dtype_auto=options.dtype == "auto")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
