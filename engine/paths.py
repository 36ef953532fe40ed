"""Where the studio keeps caches and data; INFERENCE_STUDIO_HOME overrides it all (tests, portable installs)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "inference-studio"
HOME_ENV = "INFERENCE_STUDIO_HOME"
CACHE_ENV = "INFERENCE_STUDIO_CACHE"  # the cache alone, e.g. to share converted models between test runs
# Read-only folders of models converted ahead of time (an installer's bundle), searched before converting.
BUNDLED_CONVERTED_ENV = "INFERENCE_STUDIO_BUNDLED_CONVERTED"


def _base_override() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Converted model weights and other things that can be rebuilt."""
    base = _base_override()
    if os.environ.get(CACHE_ENV):
        path = Path(os.environ[CACHE_ENV]).expanduser()
    else:
        path = base / "cache" if base else Path(platformdirs.user_cache_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Chats and other user data that must survive."""
    base = _base_override()
    path = base / "data" if base else Path(platformdirs.user_data_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def converted_models_dir() -> Path:
    path = cache_dir() / "converted"
    path.mkdir(parents=True, exist_ok=True)
    return path


def bundled_converted_dirs() -> list[Path]:
    """Read-only folders holding converted models shipped with an install, in search order (os.pathsep list)."""
    value = os.environ.get(BUNDLED_CONVERTED_ENV, "")
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part]
