"""transformers' table of its lazily imported names kept on disk between starts, instead of rebuilt by every process."""

from __future__ import annotations

import importlib.abc
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from engine import paths

log = logging.getLogger(__name__)

# Why: `import transformers` and its first model class each call transformers.utils.import_utils.
# define_import_structure over the 1,100 files of transformers/models (reading every file and matching `__all__`
# with regular expressions), twice per process because the two calls pass different arguments: 0.5 s of a 3B GGUF's
# 4.2 s from start to /health, on the loader's path while its weights convert on the other core. The table depends
# only on the installed files, so it is kept per transformers version and folder state and read back in milliseconds.
MODULE = "transformers.utils.import_utils"
FORMAT = 1  # bump when the file layout changes
_lock = threading.Lock()


def folder() -> Path:
    return paths.cache_dir() / "transformers-imports"


def install() -> None:
    """Before transformers is imported: its import table comes from the disk cache from now on in this process. Does
    nothing where transformers is imported already (the table is built) or the hook is in place."""
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    if getattr(sys, "frozen", False):  # a packaged studio's importer keeps modules its own way: left alone
        return
    sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils with the other finders and hands its loader back wrapped (once)."""

    def find_spec(self, name: str, path: Sequence[str] | None, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)  # once: what follows is the normal import
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        original = getattr(module, "define_import_structure", None)
        if callable(original):  # transformers' package __init__ takes it from here right after
            module.define_import_structure = cached(getattr(original, "__wrapped__", original))

    def __getattr__(self, name: str):
        return getattr(self._inner, name)  # get_filename, get_source, is_package: the file loader's own


def cached(build: Callable) -> Callable:
    """define_import_structure read from the disk cache, built (and saved) where missing or stale. Per process it
    returns the same object for the same arguments, as transformers' lru_cache does (its callers update it). A call
    of another shape (a later transformers' arguments) goes to transformers' own function."""
    memo: dict[tuple[str, str | None], dict] = {}

    def define_import_structure(*args, **kwargs) -> dict:
        try:
            module_path, prefix = _arguments(*args, **kwargs)
        except TypeError:
            return build(*args, **kwargs)
        key = (str(module_path), prefix)
        if key not in memo:
            memo[key] = _read_or_build(build, module_path, prefix)
        return memo[key]

    define_import_structure.__wrapped__ = build  # type: ignore[attr-defined]
    return define_import_structure


def _arguments(module_path: str | os.PathLike, prefix: str | None = None) -> tuple[str | os.PathLike, str | None]:
    if not isinstance(module_path, str | os.PathLike) or not isinstance(prefix, str | None):
        raise TypeError("not the arguments this cache knows")
    return module_path, prefix


def _read_or_build(build: Callable, module_path, prefix: str | None) -> dict:
    try:
        file = folder() / f"{_stamp(Path(module_path), prefix)}.json"
    except OSError as exc:  # no cache folder to be had: built as transformers would
        log.debug("transformers' import table not cached: %s", exc)
        return build(module_path, prefix)
    try:
        return _decode(json.loads(file.read_text()))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError) as exc:  # unreadable or altered: built again, written over
        log.debug("transformers' import table %s not used: %s", file.name, exc)
    table = build(module_path, prefix)
    with _lock:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            partial = file.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(_encode(table)))
            os.replace(partial, file)  # atomic: another process reads the whole table or none
            _forget_other_versions(file)
        except (OSError, TypeError, ValueError) as exc:  # a read-only cache, a table JSON cannot hold: built here
            log.debug("transformers' import table not saved: %s", exc)
    return table


def _forget_other_versions(kept: Path) -> None:
    """The tables of other transformers versions go once this one writes: the folder holds one version's (a dozen
    files, a few hundred KB), not one per upgrade."""
    version = kept.name.split("-", 1)[0]
    for other in kept.parent.glob("*.json"):
        if not other.name.startswith(f"{version}-"):
            other.unlink(missing_ok=True)


def _stamp(module_path: Path, prefix: str | None) -> str:
    """What the table depends on: transformers' version, the folder, its state (files added or removed change the
    folder's time; an edited install, its __init__'s) and the prefix."""
    import hashlib

    version = getattr(sys.modules.get("transformers"), "__version__", "?")
    times = [_mtime(module_path), _mtime(module_path / "__init__.py")]
    text = json.dumps([FORMAT, version, str(module_path.resolve()), prefix, times])
    return f"{version}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _encode(table: dict) -> list:
    """{frozenset(backends): {module: {names}}} as JSON: sorted lists (frozensets are not JSON)."""
    return [
        [sorted(backends), {module: sorted(names) for module, names in modules.items()}]
        for backends, modules in table.items()
    ]


def _decode(data: list) -> dict:
    return {
        frozenset(backends): {module: set(names) for module, names in modules.items()} for backends, modules in data
    }
