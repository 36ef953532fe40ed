"""Convert a .gguf file once into a Hugging Face folder under the user cache, keyed by the file's content."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelFormatError
from engine.paths import bundled_converted_dirs, converted_models_dir

log = logging.getLogger(__name__)

MARKER = "studio-conversion.json"
_CONVERSION_FORMAT = 1  # bump when the folder layout changes, so old caches are rebuilt


def file_digest(path: Path) -> str:
    """sha256 of the file, memoized by (path, size, mtime) so a second start doesn't re-read gigabytes."""
    stat = path.stat()
    index_path = converted_models_dir() / "digests.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if key in index:
        return index[key]
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            sha.update(chunk)
    digest = sha.hexdigest()
    index[key] = digest
    tmp = index_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index, indent=0))
    os.replace(tmp, index_path)
    return digest


def read_gguf_metadata(path: Path) -> dict[str, str]:
    """Architecture and quantization type from the header; raises ModelFormatError for a broken file."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/IndexError/OSError for junk and truncation
        raise ModelFormatError(
            f"{path.name} is not a readable GGUF file ({_first_line(exc)}); it may be truncated or "
            "not a GGUF model: download it again"
        ) from None

    def field_text(name: str) -> str | None:
        field = reader.fields.get(name)
        if field is None:
            return None
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")

    meta = {"architecture": field_text("general.architecture") or "unknown"}
    file_type = reader.fields.get("general.file_type")
    if file_type is not None:
        code = int(file_type.parts[file_type.data[0]][0])
        try:
            meta["file_type"] = gguf.LlamaFileType(code).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            meta["file_type"] = f"type {code}"
    return meta


def converted_folder(path: Path, progress: Callable[[str], None] | None = None) -> tuple[Path, dict]:
    """The cached Hugging Face folder for this GGUF file, converting it first if needed."""
    digest = file_digest(path)
    name = f"{_safe_stem(path)}-{digest[:16]}"
    # An install may ship the conversion (read-only, never repaired here): first start is then instant.
    for folder in bundled_converted_dirs():
        info = _finished_conversion(folder / name)
        if info is not None:
            return folder / name, info
    target = converted_models_dir() / name
    info = _finished_conversion(target)
    if info is not None:
        return target, info
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)

    meta = read_gguf_metadata(path)
    if progress:
        progress(f"converting {path.name} ({meta.get('file_type', '?')}) to float32; only the first time")
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=converted_models_dir()))
    try:
        _convert(path, tmp)
        info = {"format": _CONVERSION_FORMAT, "source": str(path), "sha256": digest, **meta}
        (tmp / MARKER).write_text(json.dumps(info, indent=1))
        if target.exists():  # another process finished first; theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s into %s", path, target)
    return target, info


def _finished_conversion(folder: Path) -> dict | None:
    """The marker of a complete conversion in the current format, or None."""
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("format") == _CONVERSION_FORMAT else None


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ModelFormatError(f"transformers cannot read {name}: {_first_line(exc)}") from None
    # The weights are dequantized already; drop the GGUF marker so they can be saved as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _safe_stem(path: Path) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:80]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
