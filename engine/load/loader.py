"""Load a model spec into model + tokenizer + a description: a GGUF file as it is stored (gguf_loader.py), a
safetensors folder in its own dtype (or quantized tensor by tensor when asked), refused before loading when it would
not fit in free memory."""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.errors import ModelFormatError, StudioError, UnsupportedOptionError
from engine.load import kv_policy, memory
from engine.load.estimate import MemoryEstimate
from engine.load.gguf_header import read_header
from engine.load.hub import download_repo
from engine.load.memory import check_fits, estimate, estimate_gguf, model_shape, release_freed_memory
from engine.load.model_source import ModelSource, SourceKind, resolve_model_spec
from engine.load.options import LoadOptions, ResolvedOptions, element_size, resolve_options
from engine.load.quantize_model import quantize_model
from engine.load.weight_plan import Mode

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class ModelInfo:
    """What the studio shows about a loaded model."""

    name: str
    spec: str
    source_kind: str
    folder: str  # the folder or the GGUF file the weights were read from
    architecture: str
    device: str
    dtype: str  # what activations (and the non-quantized weights) are in
    quantization: str  # "none", or the formats the linears are held in ("int4+int8")
    parameters: int
    weight_bytes: int
    kv_bytes_per_token: int
    context_length: int
    load_seconds: float
    notes: list[str] = field(default_factory=list)
    #: per format: how the stored tensors became it ("int4 (Q4_1 as stored): 210 tensors; ...")
    weight_formats: str = ""
    #: the options that load this model again the same way (for "another precision of this model")
    load_options: LoadOptions = field(default_factory=LoadOptions)

    @property
    def description(self) -> str:
        quant = "" if self.quantization == "none" else f", {self.quantization}"
        params = _format_count(self.parameters)
        text = f"{self.name} ({self.architecture}, {params} params, {self.dtype}{quant} on {self.device})"
        notes = ([self.weight_formats] if self.weight_formats else []) + self.notes
        return text + ("; " + "; ".join(notes) if notes else "")


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    info: ModelInfo
    source: ModelSource
    options: ResolvedOptions  # dtype: what the model computes in (a bfloat16 folder under auto: bfloat16)
    #: the KV cache's dtype (kv_policy.py)
    kv_dtype: torch.dtype = torch.float32
    #: float32 skeleton with the engine's weight modules (not a plain transformers model of one dtype)
    as_stored: bool = False


def read_config(folder: Path):
    from transformers import AutoConfig

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelFormatError(f"{folder} has no config.json; it is not a Hugging Face model folder")
    try:
        json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{config_path} is not valid JSON ({exc}); the download may be incomplete") from None
    try:
        return AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelFormatError(f"transformers cannot read {config_path}: {_first_line(exc)}") from None


def _check_weights(folder: Path) -> None:
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        raise ModelFormatError(f"{folder} has a config.json but no weights (*.safetensors or pytorch_model*.bin)")


def _folder(source: ModelSource, progress: Progress | None, config_only: bool = False) -> Path:
    if source.kind is SourceKind.HF_FOLDER:
        assert source.path is not None
        return source.path
    assert source.repo_id is not None
    if progress:
        progress(f"fetching {source.repo_id} from the hub cache or the hub")
    return download_repo(source.repo_id, source.revision, config_only=config_only)


def estimate_for_spec(spec: str | None, options: LoadOptions = LoadOptions()) -> MemoryEstimate:
    """Memory estimate without loading weights (a hub repo's config may be fetched); a GGUF file's header is read."""
    resolved = resolve_options(options)
    source = resolve_model_spec(spec)
    if source.is_gguf:
        assert source.path is not None
        return estimate_gguf(read_header(source.path), resolved)
    folder = _folder(source, None, config_only=source.kind is SourceKind.HUB_REPO)
    config = read_config(folder)
    return estimate(model_shape(config), folder_options(resolved, config))


def folder_options(resolved: ResolvedOptions, config) -> ResolvedOptions:
    """A safetensors folder under `auto` loads in its own dtype (float16 as bfloat16 on a CPU, which lacks fast
    float16 kernels); an engine int8/int4 model computes in float32 around its weight modules."""
    if resolved.engine_quantized:
        return replace(resolved, dtype=torch.float32)
    if not resolved.dtype_auto or resolved.device != "cpu" or resolved.quantization != "none":
        return resolved
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    if stored in (torch.bfloat16, torch.float16):
        return replace(resolved, dtype=torch.bfloat16)
    return resolved


def _quantization_config(resolved: ResolvedOptions):
    from transformers import BitsAndBytesConfig

    if resolved.quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=resolved.quantization,
        bnb_4bit_compute_dtype=resolved.dtype,
    )


def load_model(
    spec: str | None = None,
    options: LoadOptions = LoadOptions(),
    progress: Progress | None = None,
    kv_budget_bytes: int | None = None,
) -> LoadedModel:
    """Resolve, download as needed, check the memory (weights, runtime and a KV cache of kv_budget_bytes, by default
    the smallest useful one), and load. Raises StudioError subclasses for user errors."""
    started = time.perf_counter()
    resolved = resolve_options(options)
    source = resolve_model_spec(spec)
    if source.is_gguf:
        loaded = _load_gguf(source, resolved, options, progress, kv_budget_bytes)
    else:
        loaded = _load_folder(source, resolved, options, progress, kv_budget_bytes)
    loaded.info.load_seconds = time.perf_counter() - started
    log.info("loaded %s in %.1fs", loaded.info.description, loaded.info.load_seconds)
    return loaded


def _kv_budget(mem: MemoryEstimate, kv_budget_bytes: int | None) -> int:
    return kv_budget_bytes if kv_budget_bytes is not None else kv_policy.minimum_budget(mem.kv_bytes_per_token)


def _load_gguf(
    source: ModelSource, resolved: ResolvedOptions, options: LoadOptions, progress, kv_budget_bytes: int | None
) -> LoadedModel:
    from engine.load import gguf_blocks, gguf_loader, native
    from engine.load.gguf_metadata import read_config as read_config_of
    from engine.load.gguf_metadata import read_tokenizer

    assert source.path is not None
    header = read_header(source.path)
    if resolved.device == "cpu" and any(entry.kind in gguf_blocks.DECODED for entry in header.tensors):
        native.available(progress)  # the first load compiles the decoders: said as its own stage, not as reading
    free = memory.free_memory_bytes(resolved.device)  # before converting ahead: what that holds is the model's own
    prefetch = gguf_loader.Prefetch.start(header, resolved, free)  # converting while transformers' code imports
    try:
        config = read_config_of(header)
        empty = gguf_loader.build_empty(config, gguf_loader.plan_for(header, resolved).dtype)  # filled if it fits
        mem = estimate_gguf(header, resolved, model_shape(config, empty))
        check_fits(mem, source.display_name, resolved.device, _kv_budget(mem, kv_budget_bytes), free)
        if progress:
            held = mem.dtype if mem.quantization == "none" else f"{mem.quantization} as stored"
            progress(f"loading {source.display_name} ({held})")
        tokenizer = read_tokenizer(header)
        try:
            built = gguf_loader.load_gguf(header, resolved, progress, config, empty, prefetch)
        except StudioError:
            raise
        except (RuntimeError, ValueError) as exc:  # torch or a decoder refusing the file's data
            raise ModelFormatError(f"cannot load {source.display_name}: {_first_line(exc)}") from None
    finally:
        if prefetch is not None:
            prefetch.cancel()  # what the builder did not take (a refused model: all of it) is let go
    model = built.model
    as_stored = built.plan.mode is Mode.AS_STORED
    shape = mem.shape
    dtype = built.plan.dtype
    held = [f for f in built.tally.formats_by_bytes if f != str(dtype).removeprefix("torch.")]
    quantization = "+".join(held) if as_stored and held else "none"
    kv_dtype = kv_policy.kv_dtype(resolved.device, dtype, as_stored)
    info = ModelInfo(
        name=source.display_name,
        spec=source.spec,
        source_kind=source.kind.value,
        folder=str(source.path),
        architecture=shape.architecture,
        device=resolved.device,
        dtype=str(dtype).removeprefix("torch."),
        quantization=quantization or "none",
        parameters=shape.parameters,
        weight_bytes=mem.weight_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token(element_size(kv_dtype)),
        context_length=shape.context_length,
        load_seconds=0.0,
        notes=[_gguf_note(header.file_type, built.plan)],
        weight_formats=built.tally.describe(),
        load_options=options,
    )
    resolved = replace(resolved, dtype=dtype)
    return LoadedModel(model, tokenizer, info, source, resolved, kv_dtype, as_stored)


def _gguf_note(file_type: str, plan) -> str:
    if plan.mode is Mode.AS_STORED:
        return f"GGUF {file_type} read as stored, no converted copy"
    dtype = str(plan.dtype).removeprefix("torch.")
    if plan.small:
        return (
            f"GGUF {file_type} dequantized in memory to float32: a small model, held in the exact format (larger "
            "files are held as stored; --quant int4 holds this one so too)"
        )
    return f"GGUF {file_type} dequantized in memory to {dtype}"


def _load_folder(
    source: ModelSource, resolved: ResolvedOptions, options: LoadOptions, progress, kv_budget_bytes: int | None
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _folder(source, progress)
    config = read_config(folder)
    _check_weights(folder)
    resolved = folder_options(resolved, config)
    shape = model_shape(config)
    mem = estimate(shape, resolved)
    check_fits(mem, source.display_name, resolved.device, _kv_budget(mem, kv_budget_bytes))
    if progress:
        progress(f"loading {source.display_name} ({resolved.dtype_name}, {resolved.quantization}) on {resolved.device}")
    # the engine's int8/int4: loaded in the folder's own dtype, then each linear quantized in turn
    load_dtype = folder_options(replace(resolved, quantization="none"), config).dtype
    kwargs: dict = {"dtype": load_dtype if resolved.engine_quantized else resolved.dtype}
    if resolved.quantization != "none" and not resolved.engine_quantized:
        kwargs["quantization_config"] = _quantization_config(resolved)
        kwargs["device_map"] = resolved.device
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(folder)
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except StudioError:
        raise
    except ImportError as exc:
        reason = _first_line(exc)
        raise UnsupportedOptionError(f"{resolved.quantization} quantization is unavailable: {reason}") from None
    except Exception as exc:  # safetensors, tokenizers and torch raise their own types for corrupt files
        raise ModelFormatError(f"cannot load {source.display_name}: {_first_line(exc)}") from None
    if resolved.engine_quantized:
        if progress:
            progress(f"quantizing {source.display_name} to {resolved.quantization}, one layer at a time")
        quantize_model(model, resolved.quantization)
        release_freed_memory()
    elif resolved.quantization == "none":
        model = model.to(resolved.device)
    model.eval()
    model.requires_grad_(False)
    kv_dtype = kv_policy.kv_dtype(resolved.device, resolved.dtype, resolved.engine_quantized)
    info = ModelInfo(
        name=source.display_name,
        spec=source.spec,
        source_kind=source.kind.value,
        folder=str(folder),
        architecture=shape.architecture,
        device=resolved.device,
        dtype=resolved.dtype_name,
        quantization=resolved.quantization,
        parameters=shape.parameters,
        weight_bytes=mem.weight_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token(element_size(kv_dtype)),
        context_length=shape.context_length,
        load_seconds=0.0,
        weight_formats=_folder_formats(resolved, load_dtype),
        notes=_folder_notes(config, resolved),
        load_options=options,
    )
    return LoadedModel(model, tokenizer, info, source, resolved, kv_dtype, resolved.engine_quantized)


def _folder_notes(config, resolved: ResolvedOptions) -> list[str]:
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if str(stored).removeprefix("torch.") == "float16" and resolved.dtype == torch.bfloat16 and resolved.dtype_auto:
        return ["float16 weights held in bfloat16: a CPU has no fast float16 kernels"]
    return []


def _folder_formats(resolved: ResolvedOptions, load_dtype: torch.dtype) -> str:
    if not resolved.engine_quantized:
        return ""
    unit = "group of 32 inputs" if resolved.quantization == "int4" else "row"
    stored = str(load_dtype).removeprefix("torch.")
    return f"{resolved.quantization} (quantized per {unit} from {stored} at load, one linear at a time)"


def _format_count(count: int) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.0f}M" if count >= 1e7 else f"{count / 1e6:.2f}M"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
