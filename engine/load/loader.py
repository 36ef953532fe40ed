"""Load a model spec into model + tokenizer + a description, with dtype, quantization and device options."""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import ModelFormatError, StudioError, UnsupportedOptionError
from engine.load.estimate import MemoryEstimate
from engine.load.gguf_cache import converted_folder
from engine.load.hub import download_repo
from engine.load.memory import estimate, model_shape
from engine.load.model_source import ModelSource, SourceKind, resolve_model_spec
from engine.load.options import LoadOptions, ResolvedOptions, resolve_options

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class ModelInfo:
    """What the studio shows about a loaded model."""

    name: str
    spec: str
    source_kind: str
    folder: str
    architecture: str
    device: str
    dtype: str
    quantization: str
    parameters: int
    weight_bytes: int
    kv_bytes_per_token: int
    context_length: int
    load_seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def description(self) -> str:
        quant = "" if self.quantization == "none" else f", {self.quantization}"
        params = _format_count(self.parameters)
        text = f"{self.name} ({self.architecture}, {params} params, {self.dtype}{quant} on {self.device})"
        return text + ("; " + "; ".join(self.notes) if self.notes else "")


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    info: ModelInfo
    source: ModelSource
    options: ResolvedOptions


def local_folder(source: ModelSource, progress: Progress | None = None) -> tuple[Path, list[str]]:
    """A Hugging Face folder for the source (converting or downloading first), plus notes for the user."""
    if source.kind is SourceKind.HF_FOLDER:
        assert source.path is not None
        return source.path, []
    if source.kind in (SourceKind.EMBEDDED, SourceKind.GGUF_FILE):
        assert source.path is not None
        folder, info = converted_folder(source.path, progress)
        quant = info.get("file_type", "quantized")
        return folder, [f"GGUF {quant} weights dequantized by transformers (converted copy cached)"]

    assert source.repo_id is not None
    if progress:
        progress(f"fetching {source.repo_id} from the hub cache or the hub")
    return download_repo(source.repo_id, source.revision), []


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


def estimate_for_spec(spec: str | None, options: LoadOptions = LoadOptions()) -> MemoryEstimate:
    """Memory estimate without loading weights (the hub config and a GGUF conversion may be fetched)."""
    resolved = resolve_options(options)
    source = resolve_model_spec(spec)
    if source.kind is SourceKind.HUB_REPO:
        assert source.repo_id is not None
        folder = download_repo(source.repo_id, source.revision, config_only=True)
    else:
        folder, _notes = local_folder(source)
    return estimate(model_shape(read_config(folder)), resolved)


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
) -> LoadedModel:
    """Resolve, convert or download as needed, and load. Raises StudioError subclasses for user errors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    resolved = resolve_options(options)
    source = resolve_model_spec(spec)
    folder, notes = local_folder(source, progress)
    config = read_config(folder)
    _check_weights(folder)
    shape = model_shape(config)
    mem = estimate(shape, resolved)

    if progress:
        progress(f"loading {source.display_name} ({resolved.dtype_name}, {resolved.quantization}) on {resolved.device}")
    kwargs: dict = {"dtype": resolved.dtype}
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
    if resolved.quantization == "none" or resolved.engine_quantized:
        model = model.to(resolved.device)
    model.eval()
    model.requires_grad_(False)

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
        kv_bytes_per_token=mem.kv_bytes_per_token,
        context_length=shape.context_length,
        load_seconds=time.perf_counter() - started,
        notes=notes,
    )
    log.info("loaded %s in %.1fs", info.description, info.load_seconds)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, source=source, options=resolved)


def _format_count(count: int) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.0f}M" if count >= 1e7 else f"{count / 1e6:.2f}M"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
