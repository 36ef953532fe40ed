"""Where the studio keeps caches and data; INFERENCE_STUDIO_HOME overrides it all (tests, portable installs)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "inference-studio"
HOME_ENV = "INFERENCE_STUDIO_HOME"
CACHE_ENV = "INFERENCE_STUDIO_CACHE"  # the cache alone, e.g. to share synthetic models between test runs


def _base_override() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Things that can be rebuilt: synthetic bench models, measured weight formats, the compiled step."""
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
