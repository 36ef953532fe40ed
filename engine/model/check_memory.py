"""The fast path's check verdicts, remembered per weights, code and machine: a later start of the same model on the
same machine and code reuses the verdict instead of checking again."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from collections.abc import Iterable
from pathlib import Path

from engine.model import remembered as remembered_
from engine.paths import cache_dir

KEEP_DAYS = 60  # as the measured weight formats: checked again after this even when nothing changed
ENGINE_ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".cpp", ".h")


def weights_identity(path: Path | None, options: object) -> str | None:
    """What the loaded weights come from: the model file (or folder's files) as the file system describes them (path,
    size, modification time: a file rewritten in place, or downloaded again, is another identity) and the load's
    options. None where there is no local source (nothing is remembered then)."""
    if path is None:
        return None
    try:
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    except OSError:
        return None
    return json.dumps([stats, repr(options)])


@functools.cache
def code_digest() -> str | None:
    """A digest of the engine's own source (loaders, forward, kernels): any change to them checks again. None where
    the source is not there to read (a frozen build without it): nothing is remembered then."""
    digest = hashlib.sha256()
    count = 0
    for source in sorted(p for p in ENGINE_ROOT.rglob("*") if p.suffix in SOURCE_SUFFIXES):
        try:
            digest.update(str(source.relative_to(ENGINE_ROOT)).encode())
            digest.update(source.read_bytes())
        except OSError:
            return None
        count += 1
    return digest.hexdigest() if count else None


@functools.cache
def library_versions() -> tuple[str, ...]:
    """The libraries the weights and the reference forward come through besides torch (in the machine's key): a new
    transformers may build another config or forward, a new gguf read the file otherwise."""
    versions = []
    for name in ("transformers", "gguf", "numpy"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} absent")
    return tuple(versions)


def key(weights: str | None, parts: Iterable[object]) -> str | None:
    """The store's key for a check of these weights with these parts (formats, kernels, KV dtype, machine), or None
    where the weights or the code can't be identified."""
    code = code_digest()
    if weights is None or code is None:
        return None
    text = json.dumps([weights, code, *library_versions(), *map(str, parts)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _store() -> Path:
    return cache_dir() / "fast-path-checks.json"


def _now() -> float:
    return remembered_.now()


def remembered(check_key: str | None) -> dict | None:
    """The passed check's fields remembered for this key, if one is and is recent enough."""
    if check_key is None:
        return None
    entry = remembered_.recent(_store(), check_key, "checked_at", KEEP_DAYS, _now())
    return entry if entry is not None and entry.get("passed") is True else None


def remember(check_key: str | None, fields: dict) -> None:
    """Keep a passed check (a failed one is checked again at every start: it turns the fast path off)."""
    if check_key is not None and fields.get("passed") is True:
        remembered_.put(_store(), check_key, {**fields, "checked_at": _now()})
